"""What a run did, read back: audit and signed export, diff, recorded tools, replay."""

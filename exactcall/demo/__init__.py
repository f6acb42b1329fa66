"""Demo services and scripts for exactcall (a local fake bank, example agents)."""

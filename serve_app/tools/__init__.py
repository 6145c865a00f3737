"""The four agent tools as one contract each (catalog.py): the arguments an LLM fills
(args.py), how the caller's credential and router headers complete them into the HTTP
request (tenancy.py), one runner every face shares (runner.py: ``POST /tools/{name}``, the
MCP server), and the text rendering for tool callers (text.py)."""

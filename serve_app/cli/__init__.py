"""Command-line tools that talk to the gateway as a client (over HTTP)."""

"""``python -m serve_app.audit``: the audit log's query CLI (``main`` in serve_app/audit/log.py)."""

from serve_app.audit.log import main

raise SystemExit(main())

"""Ingest: the document, job and event routes, the ingest service, its job worker and sync."""

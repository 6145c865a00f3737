"""Unit tests of serve_app/ingest/ (the folder mirrors the product tree)."""

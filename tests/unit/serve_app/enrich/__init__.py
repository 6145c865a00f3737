"""Unit tests of serve_app/enrich/ (the folder mirrors the product tree)."""

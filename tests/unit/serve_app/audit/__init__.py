"""Unit tests of serve_app/audit/ (the folder mirrors the product tree)."""

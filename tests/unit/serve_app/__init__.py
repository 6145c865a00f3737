"""Unit tests of serve_app/ (the folder mirrors the product tree)."""

"""Unit tests of serve_app/cli/ (the folder mirrors the product tree)."""

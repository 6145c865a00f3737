"""Unit tests of serve_app/auth/ (the folder mirrors the product tree)."""

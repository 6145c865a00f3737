"""Unit tests of serve_app/search/ (the folder mirrors the product tree)."""

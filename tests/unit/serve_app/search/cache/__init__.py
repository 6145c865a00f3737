"""Unit tests of serve_app/search/cache/ (the folder mirrors the product tree)."""

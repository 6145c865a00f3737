"""Unit tests of serve_app/graph/ (the folder mirrors the product tree)."""

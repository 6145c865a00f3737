"""Unit tests of serve_app/http/ (the folder mirrors the product tree)."""

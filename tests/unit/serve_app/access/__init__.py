"""Unit tests of serve_app/access/ (the folder mirrors the product tree)."""

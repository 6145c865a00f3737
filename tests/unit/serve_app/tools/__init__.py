"""Unit tests of serve_app/tools/ (the folder mirrors the product tree)."""

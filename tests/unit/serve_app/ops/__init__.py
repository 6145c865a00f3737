"""Unit tests of serve_app/ops/ (the folder mirrors the product tree)."""

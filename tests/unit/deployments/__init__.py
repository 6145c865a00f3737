"""Unit tests of deployments/ (the folder mirrors the product tree)."""

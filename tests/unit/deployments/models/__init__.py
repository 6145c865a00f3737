"""Unit tests of deployments/models/ (the folder mirrors the product tree)."""

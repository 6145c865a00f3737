"""Unit tests of deployments/vector_store/ (the folder mirrors the product tree)."""

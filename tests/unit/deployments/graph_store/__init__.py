"""Unit tests of deployments/graph_store/ (the folder mirrors the product tree)."""

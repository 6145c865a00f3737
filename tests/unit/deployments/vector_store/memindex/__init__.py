"""Unit tests of deployments/vector_store/memindex/ (the folder mirrors the product tree)."""

"""Unit tests of deployments/testing/ (the folder mirrors the product tree)."""

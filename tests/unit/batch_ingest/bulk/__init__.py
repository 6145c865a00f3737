"""Unit tests of batch_ingest/bulk/ (the folder mirrors the product tree)."""

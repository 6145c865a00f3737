"""Unit tests of batch_ingest/ (the folder mirrors the product tree)."""

"""Unit tests of batch_ingest/reindex/ (the folder mirrors the product tree)."""

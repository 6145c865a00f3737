"""Unit tests of batch_ingest/events/ (the folder mirrors the product tree)."""

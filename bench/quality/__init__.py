"""Retrieval-quality evaluation on labeled sets built from texts that ship offline."""

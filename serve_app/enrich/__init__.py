"""Enrich: POST /rag/enrich_answer, its service and the claim extraction."""

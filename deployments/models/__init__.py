"""The model backends (docs: ../shared/LAYOUT.md; the embedder and reranker shells move here)."""

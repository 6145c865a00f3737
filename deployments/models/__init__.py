"""The model backends: the embedder and reranker (cores and Serve shells) and their runtimes."""

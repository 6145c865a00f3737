"""Search: POST /rag/search_docs, its service, retrieval, ranking, snippets and semantic cache."""

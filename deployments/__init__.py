"""Serve deployments of the RAG Gateway: embedder, reranker, retriever (Milvus), graph (Neo4j).

Each module holds a plain core class that tests build without Ray and a thin Serve shell
around it. Nothing here imports from ``batch_ingest`` or ``serve_app``.
"""

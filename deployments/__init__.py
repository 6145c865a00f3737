"""The backends of the RAG Gateway: ``models/`` (embedder, reranker), ``vector_store/``
(Milvus, the Retriever), ``graph_store/`` (Neo4j, the Graph), over a shared kernel of the
top-level modules (config, protocols, errors, ACLs, health, metrics, tracing); ``testing/``
holds their fakes. Each backend keeps a plain core that tests build without Ray apart from
its thin Serve shell. The backends never import each other, the kernel imports none of them,
and nothing here imports from ``batch_ingest`` or ``serve_app``.
"""

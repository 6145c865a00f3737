"""The vector store backend: Milvus, the tenancy filter, the in-memory index and the Serve shell."""

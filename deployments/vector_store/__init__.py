"""The vector store backend (../shared/LAYOUT.md: the Retriever and Milvus modules move here)."""

"""The semantic cache of rag.search_docs: where entries live (store.py) and how requests become
keys and answers (semantic.py)."""

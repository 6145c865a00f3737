"""The RAG Gateway ingress: routes, contracts, access context, and the typed app builder."""

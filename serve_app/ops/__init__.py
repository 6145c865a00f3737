"""Operations: reindex, audit and usage routes, health, and the catalog surface."""

"""Graph: the graph routes, their contracts, the graph service and its sentences."""

"""Neo4j driver values as plain JSON: nodes, relationships and paths become dicts with
``_type``; the properties that only serve the gateway's own lookups are left out."""

from __future__ import annotations

from typing import Any


def to_plain(value: Any) -> Any:
    """Neo4j values as JSON: nodes, relationships and paths become dicts with ``_type``."""
    from neo4j.graph import Node, Path, Relationship

    if isinstance(value, Node):
        return _node(value)
    if isinstance(value, Relationship):
        return _relationship(value)
    if isinstance(value, Path):
        return {
            "_type": "path",
            "nodes": [_node(n) for n in value.nodes],
            "relationships": [_relationship(r) for r in value.relationships],
        }
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if hasattr(value, "iso_format"):  # neo4j temporal types
        return value.iso_format()
    return value


# Node properties that only serve the gateway's own lookups.
_INTERNAL = ("wiki_id", "wiki_title")


def _node(node: Any) -> dict[str, Any]:
    props = {k: to_plain(v) for k, v in dict(node).items() if k not in _INTERNAL}
    return {"_type": "node", "labels": sorted(node.labels), **props}


def _relationship(rel: Any) -> dict[str, Any]:
    def ref(n: Any) -> dict[str, Any]:
        return {"label": min(n.labels) if n.labels else "", "id": n.get("id")}

    props = {k: to_plain(v) for k, v in dict(rel).items()}
    return {
        "_type": "relationship",
        "type": rel.type,
        "start": ref(rel.start_node),
        "end": ref(rel.end_node),
        **props,
    }


def node_label(node: dict[str, Any]) -> str:
    """A serialised node's first label (``Node`` when it has none)."""
    labels = node.get("labels") or []
    return labels[0] if labels else "Node"

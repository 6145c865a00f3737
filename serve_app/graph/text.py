"""How a graph path reads to a person: one sentence per path of graph.explain_path."""

from __future__ import annotations

from typing import Any

from deployments.graph_store.values import node_label

# The verb of each relationship type in a sentence (others: the type in lower case).
PHRASES = {
    "MEMBER_OF": "is a member of",
    "SERVES": "serves",
    "MENTIONS": "mentions",
    "USES": "uses",
    "LINKS_TO": "links to",
    "PART_OF": "is part of",
    "POSTED_IN": "was posted in",
    "AUTHORED": "authored",
}


def _display(node: dict[str, Any]) -> str:
    name = node.get("name") or node.get("title") or node.get("id") or "?"
    return f"{node_label(node)} '{name}'"


def path_sentence(path: dict[str, Any]) -> str:
    """One readable sentence for a serialised path: each hop in its stored direction."""
    nodes = path["nodes"]
    clauses = []
    for i, rel in enumerate(path["relationships"]):
        a, b = nodes[i], nodes[i + 1]
        forward = rel["start"]["id"] == a.get("id") and rel["start"]["label"] in a["labels"]
        src, dst = (a, b) if forward else (b, a)
        phrase = PHRASES.get(rel["type"], rel["type"].lower().replace("_", " "))
        clauses.append(f"{_display(src)} {phrase} {_display(dst)}")
    if not clauses:
        return f"{_display(nodes[0])} is the entity itself."
    return "; ".join(clauses) + "."

"""The real graph's seed and its oracle: the tenancy corpus turned into documents with
wiki-links, authors, channels, agents and topics, plus entities written directly (members,
resources, helper agents and their relationships), in both visibilities, with a gmk<j>g
marker in every id or name. ``GraphSeed.visible`` says who may see each of them, written
from the policy's rules (the property tests' ``may_read``), not from AccessContext.
"""

from __future__ import annotations

import re
from typing import Any

from deployments.graph_store.cypher import NODE_LABELS
from serve_app.testing import TENANCY_ACLS, TENANCY_LAYOUT

# Every graph entity of the seed (but documents, which carry the corpus markers qmk<i>q)
# carries gmk<j>g in its id or name: a leak is found by string search of the response.
GRAPH_MARKER = re.compile(r"gmk(\d+)g")
# The tenancy layout plus a project only confidential documents name.
GRAPH_LAYOUT = (
    *TENANCY_LAYOUT,
    ("secret_plan", "confidential", "doc", "prj_secret"),
    ("skill", "public", "wiki", ""),
)


def graph_corpus(teams: tuple[str, ...]) -> list[dict[str, Any]]:
    """The tenancy corpus for the real graph: per team the tenancy layout (plus a project
    only confidential documents name), every document with an author, a channel, an agent
    and a topic (ids with a gmk marker: those of its visibility, or, for a document with an
    ACL, its own), [[links]] to the team's next document and, from one document of each
    visibility, to a note that does not exist (a placeholder). Markers qmk<i>q are the
    document index, as in the tenancy corpus."""
    from serve_app.testing import marker

    docs: list[dict[str, Any]] = []
    ents = 0
    for team in teams:
        per_vis: dict[str, dict[str, str]] = {}
        for vis in ("pub", "conf"):
            per_vis[vis] = {}
            for kind in ("user", "ch", "ag", "topic", "missing"):
                per_vis[vis][kind] = f"{kind}_{vis}_gmk{ents}g"
                ents += 1
        n = len(GRAPH_LAYOUT)
        for k, (suffix, visibility, doc_type, project) in enumerate(GRAPH_LAYOUT):
            index = len(docs)
            vis = "pub" if visibility == "public" else "conf"
            # A document with an ACL names an author, channel, agent and topic of its own:
            # entities that exist only because of it, seen only by whom its ACL admits.
            names = per_vis[vis]
            if suffix in TENANCY_ACLS:
                names = {}
                for kind in ("user", "ch", "ag", "topic"):
                    names[kind] = f"{kind}_{suffix}_gmk{ents}g"
                    ents += 1
            doc_id = f"{team}_{suffix}_{marker(index)}"
            # Linked by title: a link's text must not carry the target's marker.
            next_title = f"{GRAPH_LAYOUT[(k + 1) % n][0]} note of {team}"
            links = f"See [[{next_title}]]."
            if suffix in ("pub_doc", "conf_doc"):
                links += f" And [[{per_vis[vis]['missing']}]]."
            tags = ["milvus", "rag", names["topic"]]
            if suffix == "skill":
                tags.append("skill:SKILL-deploy")
            docs.append(
                {
                    "team_id": team,
                    "doc_id": doc_id,
                    "title": f"{suffix} note of {team}",
                    "text": f"Milvus gateway search notes of {team} about {doc_type} "
                    f"{marker(index)} deploy budget. {links}",
                    "visibility": visibility,
                    "doc_type": doc_type,
                    "project_id": project,
                    "channel_id": names["ch"],
                    "agent_id": names["ag"],
                    "author_id": names["user"],
                    "tags": tags,
                    **({"acl": TENANCY_ACLS[suffix]} if suffix in TENANCY_ACLS else {}),
                }
            )
    return docs


def node_doc(node: dict[str, Any]) -> dict[str, Any]:
    """A Doc node as the oracle's document (``may_read``)."""
    return {
        "team_id": node.get("team_id"),
        "doc_id": str(node.get("id") or ""),
        "visibility": node.get("visibility"),
        "doc_type": node.get("doc_type") or "",
        "project_id": node.get("project_id") or "",
        "tags": list(node.get("tags") or ()),
        "acl_allow": list(node.get("acl_allow") or ("*",)),
        "acl_deny": list(node.get("acl_deny") or ()),
    }


class GraphSeed:
    """The gmk-marked entities of the seed and who may see them (the oracle)."""

    def __init__(self, teams: tuple[str, ...], corpus: list[dict[str, Any]]) -> None:
        from batch_ingest.wikilinks import extract_links, wiki_key

        self.teams = teams
        self.corpus = corpus
        # j -> {"team_id", "label", "id", "name", "visibility", "doc": oracle doc or None}
        self.entities: dict[int, dict[str, Any]] = {}
        self.by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.next_marker = 0
        self.upserts: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for doc in corpus:
            for m in GRAPH_MARKER.findall(str(doc)):
                self.next_marker = max(self.next_marker, int(m) + 1)
        for i, doc in enumerate(corpus):
            self.by_key[(doc["team_id"], "Doc", doc["doc_id"])] = {
                "team_id": doc["team_id"],
                "label": "Doc",
                "id": doc["doc_id"],
                "visibility": doc["visibility"],
                "doc": doc,
                "qmk": i,
            }
        for team in teams:
            docs = [d for d in corpus if d["team_id"] == team]
            self._add(team, "MicroDAO", team, team, "public")
            keys = {wiki_key(d[f]) for d in docs for f in ("doc_id", "title")}
            # Entities the documents make (derived): seen through a document only.
            made: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for d in docs:
                refs = [
                    ("Project", d["project_id"]),
                    ("Channel", d["channel_id"]),
                    ("Agent", d["agent_id"]),
                    ("User", d["author_id"]),
                    *(("Topic", t) for t in d["tags"]),
                ]
                for key in refs:
                    if key[1]:
                        made.setdefault(key, []).append(d)
                for link in extract_links(d["text"]):
                    if link not in keys:
                        made.setdefault(("Doc", "wiki:" + link), []).append(d)
            for (label, ident), sources in made.items():
                vis = (
                    "public"
                    if any(d["visibility"] == "public" for d in sources)
                    else ("confidential")
                )
                self._add(team, label, ident, ident, vis, sources=sources)
            nodes, rels = [], []
            fresh = {}
            for label, key, vis in (
                ("User", "member_pub", "public"),
                ("User", "member_conf", "confidential"),
                ("Resource", "res_pub", "public"),
                ("Resource", "res_conf", "confidential"),
                ("Agent", "helper_pub", "public"),
                ("Agent", "helper_conf", "confidential"),
            ):
                j = self._take()
                ident = f"{key}_gmk{j}g"
                name = f"{key.split('_')[0].title()} {key} gmk{j}g"
                self._add(team, label, ident, name, vis, marker=j)
                nodes.append({"label": label, "id": ident, "name": name, "visibility": vis})
                fresh[key] = ident
            user_pub = next(d["author_id"] for d in docs if d["visibility"] == "public")
            for rtype, a, b, vis, props in (
                (
                    "MEMBER_OF",
                    ("User", fresh["member_pub"]),
                    ("MicroDAO", team),
                    "public",
                    {"role": "guardian"},
                ),
                ("MEMBER_OF", ("User", user_pub), ("MicroDAO", team), "public", {"role": "member"}),
                (
                    "MEMBER_OF",
                    ("User", fresh["member_conf"]),
                    ("MicroDAO", team),
                    "confidential",
                    {"role": "member"},
                ),
                ("USES", ("Project", "prj_open"), ("Resource", fresh["res_pub"]), "public", {}),
                ("USES", ("Project", "prj_ops"), ("Resource", fresh["res_pub"]), "public", {}),
                (
                    "USES",
                    ("Project", "prj_board"),
                    ("Resource", fresh["res_conf"]),
                    "confidential",
                    {},
                ),
                (
                    "USES",
                    ("Project", "prj_secret"),
                    ("Resource", fresh["res_pub"]),
                    "confidential",
                    {},
                ),
                (
                    "USES",
                    ("Project", "prj_open"),
                    ("Resource", fresh["res_conf"]),
                    "confidential",
                    {},
                ),
                ("SERVES", ("Agent", fresh["helper_pub"]), ("Project", "prj_open"), "public", {}),
                ("SERVES", ("Agent", fresh["helper_pub"]), ("MicroDAO", team), "public", {}),
                (
                    "SERVES",
                    ("Agent", fresh["helper_conf"]),
                    ("Project", "prj_secret"),
                    "confidential",
                    {},
                ),
                (
                    "SERVES",
                    ("Agent", fresh["helper_conf"]),
                    ("Project", "prj_ops"),
                    "confidential",
                    {},
                ),
            ):
                rels.append(
                    {
                        "type": rtype,
                        "from": {"label": a[0], "id": a[1]},
                        "to": {"label": b[0], "id": b[1]},
                        "visibility": vis,
                        "properties": props,
                    }
                )
            self.upserts[team] = {"nodes": nodes, "relationships": rels}

    def _take(self) -> int:
        self.next_marker += 1
        return self.next_marker - 1

    def _add(
        self, team, label, ident, name, vis, *, doc=None, marker=None, sources=None
    ) -> dict[str, Any]:
        """Register an entity: ``sources`` (the documents naming it) for one documents made,
        none for one written directly."""
        found = GRAPH_MARKER.findall(f"{ident} {name}")
        j = marker if marker is not None else (int(found[-1]) if found else None)
        entry = {
            "team_id": team,
            "label": label,
            "id": ident,
            "name": name,
            "visibility": vis,
            "doc": doc,
            "gmk": j,
            "sources": sources,
        }
        if j is not None:
            self.entities[j] = entry
        self.by_key[(team, label, ident)] = entry
        return entry

    def refs(self, team: str | None = None) -> list[str]:
        """Ids and names of every entity of ``team`` or every team (probe arguments)."""
        out = []
        for e in self.by_key.values():
            if team is not None and e["team_id"] != team:
                continue
            out.append(e["id"])
            if e.get("name"):
                out.append(e["name"])
            if e.get("doc") and e["doc"].get("title"):
                out.append(e["doc"]["title"])
        return out

    # --- the oracle --------------------------------------------------------------------------
    def visible(self, ident: dict[str, Any], team: str, conf: bool, entity: dict[str, Any]) -> bool:
        """Whether ``entity`` (a registry entry or a serialised node) is inside the scope of
        ``ident`` in ``team`` (mode confidential or not): documents by the property tests'
        ``may_read``; an entity documents made when one of them is; one written directly
        by team and visibility, a project also by its project policy."""
        from tests.security.test_tenancy_properties import (
            CONFIDENTIAL_ROLES,
            may_read,
            resource_allowed,
        )

        labels = entity.get("labels") or [entity.get("label")]
        if entity.get("team_id") != team:
            return False
        label = next((lb for lb in labels if lb in NODE_LABELS), labels[0])
        entity = self.by_key.get((team, label, entity.get("id")), entity)
        if entity.get("sources") is not None:
            return any(may_read(ident, team, conf, d) for d in entity["sources"])
        if "Doc" in labels:
            doc = entity.get("doc") or node_doc(entity)
            return may_read(ident, team, conf, doc)
        roles = set(ident["teams"].get(team, ()))
        if not roles or entity.get("team_id") != team:
            return False
        if entity.get("visibility") != "public" and not (
            entity.get("visibility") == "confidential" and conf and roles & CONFIDENTIAL_ROLES
        ):
            return False
        if "Project" in labels:
            project = {"project_id": entity.get("id") or "", "doc_id": "", "tags": []}
            return resource_allowed(project, ident["groups"], ident["permissions"])
        return True

    def visible_markers(
        self, ident: dict[str, Any], team: str, conf: bool
    ) -> tuple[set[int], set[int]]:
        from tests.security.test_tenancy_properties import may_read

        docs = {i for i, d in enumerate(self.corpus) if may_read(ident, team, conf, d)}
        ents = {j for j, e in self.entities.items() if self.visible(ident, team, conf, e)}
        return docs, ents

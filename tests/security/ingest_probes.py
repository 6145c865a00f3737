"""Probes of ``POST /ingest/documents``: one to three documents for a team the caller was or
was not granted, with random or adversarial ids, texts, visibilities, doc types, projects,
channels and skill tags. A write the caller may not make (the property tests' ``may_write``)
is a leak, so is a row written in a team the identity does not hold, and so is a refused
request that changed any row of the store.
"""

from __future__ import annotations

from typing import Any

from tests.security.probe_kit import ENDPOINTS, ProbeKit


class IngestProbes(ProbeKit):
    """Ingest probes (``ingest_gw``, ``dev_ingest_gw``: gateways of their own, so that the
    writes never reach what the search probes read)."""

    ingest_gw: Any
    dev_ingest_gw: Any

    def probe_ingest(self, kind: str) -> None:
        from tests.security.test_tenancy_properties import may_write

        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        noisy = rng.random() < 0.5
        docs = []
        for _ in range(rng.randint(1, 3)):
            doc: dict[str, Any] = {
                "team_id": self.team(expected, noisy, kind == "api_key_other_team"),
                "doc_id": self.maybe(["d1", "dao_a_pub_doc", "SKILL-deploy", "d2"], noisy),
                "text": self.maybe(["Milvus notes", "budget plan"], noisy),
            }
            for name, values in (
                ("visibility", ["confidential", "public"]),
                ("doc_type", ["transaction", "doc", "wiki", "message", "file"]),
                ("project_id", ["prj_ops", "", "prj_board", "prj_open"]),
                ("title", ["A title"]),
                ("channel_id", ["ch_1"]),
            ):
                if rng.random() < 0.6:
                    doc[name] = self.maybe(values, noisy)
            if rng.random() < 0.3:
                doc["tags"] = [self.maybe(["skill:SKILL-deploy", "rag"], noisy)]
            docs.append(doc)
        gw = self.dev_ingest_gw if expected == "dev" else self.ingest_gw
        before = dict(gw.store.rows)
        response = gw.ingest(docs, **headers)
        problem = self.common_failure(expected, response)
        changed = {cid: r for cid, r in gw.store.rows.items() if before.get(cid) is not r}
        if problem is None and response.status_code != 200 and changed:
            problem = f"a {response.status_code} changed {len(changed)} rows"
        if problem is None and response.status_code == 200:
            if expected == "dev":
                teams = {str(d["team_id"]).strip() for d in docs}
                ident = {
                    "teams": {t: ["owner"] for t in teams},
                    "groups": set(),
                    "permissions": set(),
                }
            else:
                ident = expected
            for doc in docs:
                normalized = {**doc, "team_id": str(doc["team_id"]).strip()}
                if not may_write(ident, normalized):
                    problem = f"wrote {doc.get('doc_id')!r} in {doc['team_id']!r}"
                    break
            written = {row.team_id for row in changed.values()}
            if problem is None and not written <= set(ident["teams"]):
                problem = f"rows written in teams {sorted(written - set(ident['teams']))}"
        self.record(ENDPOINTS[1], kind, response, problem)

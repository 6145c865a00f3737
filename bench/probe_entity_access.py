"""Probe a running gateway (JWT mode) for graph entities that leak past document ACLs.

Issue 32's measurement, from outside, over HTTP: as a team owner, ingest one document per
ACL form (nine forms, one of them confidential) whose text is a real AppStream description
and which names a tag, a channel, an author and an agent of its own (canaries). Then ten
callers (no groups, ``hr``, ``contractors``, both, ``finance``, users ``alice``, ``bob``,
``carol``, an owner without and with ``hr``) ask, for every form: a graph-boosted search
naming the canaries, explain_path author → tag, ENTITY_NEIGHBOURS of the author and
EXPERTS_ON_TOPIC of the tag. Three phases: the first ACLs; every document moved to the next
form's ACL; then half of the documents deleted.

Counted per phase:
* **names**: a canary of a document the caller may not read in an answer (in
  ``graph.entities``, or anywhere in a body that did not echo it from the request);
* **confirmations**: explain_path answering other than exactly like a name that does not
  exist, or an intent returning rows, for such a canary;
* **losses**: a caller the ACL admits that does not get the entity (explain_path 404, or no
  rows).

    AUTH__MODE=jwt AUTH__HS256_SECRET=... .venv/bin/python -m bench.probe_entity_access \\
        --url http://127.0.0.1:8000

The secret (and ``AUTH__ISSUER`` / ``AUTH__AUDIENCE`` when the gateway checks them) must be
the gateway's: tokens are minted like ``python -m serve_app.auth mint-token`` does.
Writes ``bench/results/entity_access-*.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from bench.common import setup_logging, write_result
from bench.quality.appstream_set import components, plain

logger = logging.getLogger("bench.probe_entity_access")

# name → (acl, visibility)
FORMS: dict[str, tuple[dict[str, list[str]], str]] = {
    "hr": ({"allowed_groups": ["hr"]}, "public"),
    "alice": ({"allowed_users": ["alice"]}, "public"),
    "notcontractors": ({"denied_groups": ["contractors"]}, "public"),
    "hrnotcontractors": ({"allowed_groups": ["hr"], "denied_groups": ["contractors"]}, "public"),
    "alicebob": ({"allowed_users": ["alice", "bob"]}, "public"),
    "hrfinance": ({"allowed_groups": ["hr", "finance"]}, "public"),
    "hrcarol": ({"allowed_groups": ["hr"], "allowed_users": ["carol"]}, "public"),
    "nothr": ({"denied_groups": ["hr"]}, "public"),
    "confhr": ({"allowed_groups": ["hr"]}, "confidential"),
}


@dataclass(frozen=True)
class Caller:
    name: str
    sub: str
    groups: tuple[str, ...]
    role: str = "member"

    @property
    def mode(self) -> str:
        return "confidential" if self.role == "owner" else "public"

    def reads(self, acl: dict[str, list[str]], visibility: str) -> bool:
        if visibility == "confidential" and self.role != "owner":
            return False
        mine = set(self.groups)
        if mine & set(acl.get("denied_groups", ())):
            return False
        allowed = set(acl.get("allowed_groups", ())), set(acl.get("allowed_users", ()))
        if not any(allowed):
            return True
        return bool(mine & allowed[0]) or self.sub in allowed[1]


CALLERS = (
    Caller("no_groups", "u_nog", ()),
    Caller("hr", "u_hr", ("hr",)),
    Caller("contractors", "u_con", ("contractors",)),
    Caller("hr_contractors", "u_hrcon", ("hr", "contractors")),
    Caller("finance", "u_fin", ("finance",)),
    Caller("alice", "alice", ()),
    Caller("bob", "bob", ()),
    Caller("carol", "carol", ()),
    Caller("owner", "u_own", (), "owner"),
    Caller("owner_hr", "u_ownhr", ("hr",), "owner"),
)


def token(team: str, caller: Caller) -> str:
    from serve_app.auth.__main__ import mint_token
    from serve_app.settings import GatewaySettings

    args = argparse.Namespace(
        secret="",
        sub=caller.sub,
        ttl=3600,
        team=[(team, [caller.role])],
        issuer="",
        audience="",
        group=list(caller.groups),
        permission=[],
        agent_id="",
    )
    return mint_token(args, GatewaySettings())


class Probe:
    def __init__(self, url: str, team: str, tag: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)
        self.team = team
        self.tag = tag
        self.owner = token(team, Caller("writer", "u_writer", ("hr",), "owner"))
        self.tokens = {c.name: token(team, c) for c in CALLERS}
        texts = [plain((c.get("Description") or {}).get("C") or "") for c in components()]
        self.texts = [t for t in texts if len(t.split()) > 30]

    def canaries(self, form: str) -> dict[str, str]:
        return {kind: f"{kind}-{form}-{self.tag}" for kind in ("tag", "channel", "author", "agent")}

    def post(self, path: str, body: dict, tok: str) -> httpx.Response:
        return self.http.post(path, json=body, headers={"authorization": f"Bearer {tok}"})

    def ingest(self, form: str, acl_form: str) -> None:
        acl, visibility = FORMS[acl_form]
        names = self.canaries(form)
        doc = {
            "team_id": self.team,
            "doc_id": f"probe-{form}.md",
            "title": f"Probe note {form}",
            "text": self.texts[list(FORMS).index(form)],
            "visibility": visibility,
            "tags": [names["tag"]],
            "channel_id": names["channel"],
            "author_id": names["author"],
            "agent_id": names["agent"],
            "acl": acl,
        }
        r = self.post("/ingest/documents", {"documents": [doc]}, self.owner)
        r.raise_for_status()

    def delete(self, form: str) -> None:
        event = {
            "event_id": uuid.uuid4().hex,
            "ts": int(time.time()),
            "domain": "doc",
            "type": "doc.deleted",
            "version": "1.0",
            "actor": {"id": "u_writer", "kind": "user"},
            "payload": {"doc_id": f"probe-{form}.md", "doc_type": "doc"},
            "meta": {"team_id": self.team, "trace_id": uuid.uuid4().hex},
        }
        r = self.post("/ingest/events", {"events": [event]}, self.owner)
        r.raise_for_status()

    def run_phase(self, acls: dict[str, str | None]) -> dict[str, Any]:
        """``acls``: each form's current ACL form (None: deleted)."""
        counts = {"names": 0, "confirmations": 0, "losses": 0, "requests": 0}
        samples: list[str] = []
        every = {f: self.canaries(f) for f in FORMS}
        for caller in CALLERS:
            tok = self.tokens[caller.name]
            hidden = {
                name
                for f, acl_form in acls.items()
                for name in every[f].values()
                if acl_form is None or not caller.reads(*FORMS[acl_form])
            }
            for form, acl_form in acls.items():
                names = every[form]
                may = acl_form is not None and caller.reads(*FORMS[acl_form])
                answers = self.ask(caller, tok, names)
                counts["requests"] += len(answers)
                for what, (request, response) in answers.items():
                    body = response.text
                    asked = json.dumps(request)
                    leaked = {n for n in hidden if n in body and n not in asked}
                    graph = response.json().get("graph") if response.status_code == 200 else None
                    leaked |= {
                        e.get("id")
                        for e in (graph or {}).get("entities", ())
                        if e.get("id") in hidden
                    }
                    if leaked:
                        counts["names"] += len(leaked)
                        samples.append(f"{caller.name} {what}: {sorted(leaked)}")
                    if what == "search":
                        continue
                    found = self.found(what, response)
                    if found and not may:
                        counts["confirmations"] += 1
                        samples.append(f"{caller.name} {what} {form}: confirmed")
                    if may and not found:
                        counts["losses"] += 1
                        samples.append(f"{caller.name} {what} {form}: lost")
        return {**counts, "samples": samples[:20]}

    def ask(self, caller: Caller, tok: str, names: dict[str, str]) -> dict[str, tuple]:
        base = {"team_id": self.team, "mode": caller.mode}
        requests = {
            "search": (
                "/rag/search_docs",
                {**base, "query": " ".join(names.values()), "graph": {"mode": "boost"}},
            ),
            "explain_path": (
                "/graph/explain_path",
                {**base, "from": names["author"], "to": names["tag"]},
            ),
            "explain_missing": (
                "/graph/explain_path",
                {**base, "from": names["author"] + "-nobody", "to": names["tag"]},
            ),
            "neighbours": (
                "/graph/query",
                {**base, "intent": "ENTITY_NEIGHBOURS", "args": {"entity": names["author"]}},
            ),
            "experts": (
                "/graph/query",
                {**base, "intent": "EXPERTS_ON_TOPIC", "args": {"topic": names["tag"]}},
            ),
        }
        out = {}
        for what, (path, body) in requests.items():
            out[what] = (body, self.post(path, body, tok))
        # explain_path of a hidden end must answer like a missing one, word for word.
        real, missing = out["explain_path"][1], out.pop("explain_missing")[1]
        real.like_missing = real.status_code == missing.status_code == 404 and (
            real.json()["message"].replace(names["author"], "?")
            == missing.json()["message"].replace(names["author"] + "-nobody", "?")
        )
        return out

    @staticmethod
    def found(what: str, response: httpx.Response) -> bool:
        if what == "explain_path":
            return not getattr(response, "like_missing", False)
        return response.status_code == 200 and bool(response.json().get("rows"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--team", default="dao_probe_entities")
    p.add_argument("--label", default="", help="a note for the result file (e.g. replicas)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    setup_logging()
    tag = uuid.uuid4().hex[:6]
    probe = Probe(args.url, args.team, tag)
    forms = list(FORMS)
    phases: dict[str, Any] = {}
    for form in forms:
        probe.ingest(form, form)
    phases["initial"] = probe.run_phase({f: f for f in forms})
    moved = {f: forms[(i + 1) % len(forms)] for i, f in enumerate(forms)}
    for form, acl_form in moved.items():
        probe.ingest(form, acl_form)
    phases["acl_changed"] = probe.run_phase(moved)
    gone = forms[::2]
    for form in gone:
        probe.delete(form)
    phases["deleted"] = probe.run_phase({f: (None if f in gone else moved[f]) for f in forms})
    for form in forms:
        if form not in gone:
            probe.delete(form)
    for name, phase in phases.items():
        logger.info(
            "%s: %d requests, %d names, %d confirmations, %d losses",
            name,
            phase["requests"],
            phase["names"],
            phase["confirmations"],
            phase["losses"],
        )
    result = {"url": args.url, "label": args.label, "forms": len(forms), "callers": len(CALLERS)}
    write_result("entity_access", {**result, "phases": phases}, args.out)
    print(json.dumps({k: {x: v[x] for x in v if x != "samples"} for k, v in phases.items()}))


if __name__ == "__main__":
    main()

"""Leak probes: random and adversarial requests against the in-process gateway (fakes, no Ray),
checking that no response carries another team's data or data the caller may not see.

The gateway is built as in tests/unit/test_tenancy_properties.py (``tests.auth_support``: a
corpus of three teams, both visibilities, several doc types, project and skill policies) with
JWT (HS256) and API key authentication. Each probe picks an identity, a credential (valid, or
expired / not yet valid / wrong audience / wrong issuer / forged / ``alg: none`` / garbage /
truncated token, an API key of another team, an unknown key, none at all) and a request with
random or adversarial fields, and sends it to ``POST /rag/search_docs``,
``POST /ingest/documents`` or ``GET /audit/decisions``. The expected visibility comes from the
oracle of the property tests (written from the policy's rules, not from AccessContext).

A leak is: a chunk (marker) of another team, or one the caller may not read, in any response;
a 200 for a team the identity does not grant; a write the caller may not make; a non-401 for
a bad credential; audit records of a team the caller may not read. Exit status 1 on any leak
or any 500.

    .venv/bin/python -m bench.leak_probes --probes 5000
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import environment_info, markdown_table, setup_logging, write_result

logger = logging.getLogger("bench.leak_probes")

ENDPOINTS = ("POST /rag/search_docs", "POST /ingest/documents", "GET /audit/decisions")
BAD_TOKENS = (
    "jwt_expired",
    "jwt_not_yet",
    "jwt_wrong_aud",
    "jwt_wrong_iss",
    "jwt_forged",
    "jwt_alg_none",
    "jwt_hs256_over_nothing",
    "jwt_garbage",
    "jwt_cut",
    "api_key_unknown",
    "no_credential",
)
# Credential kinds and their weights: most probes carry a valid credential, so that enough of
# them reach a 200 and the data that comes back can be checked.
CREDENTIALS = (
    ("jwt_valid", 16),
    ("api_key_valid", 4),
    ("api_key_other_team", 3),
    ("dev_body_trust", 3),
    *((kind, 1) for kind in BAD_TOKENS),
)
QUERIES = ("Milvus gateway search notes", "deploy budget qmk3q", "qmk12q", "")
DOC_TYPES = ("doc", "wiki", "message", "transaction", "file", "rwa")


@contextlib.contextmanager
def isolated_env(audit_url: str) -> Iterator[None]:
    """No gateway variable of the surrounding shell, and the audit log in ``audit_url``."""
    from deployments.config import GatewaySettings

    sections = tuple(GatewaySettings.model_fields)
    saved = dict(os.environ)
    try:
        for name in list(os.environ):
            lowered = name.lower()
            if any(lowered == s or lowered.startswith(s + "__") for s in sections):
                del os.environ[name]
        os.environ["AUDIT__URL"] = audit_url
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Prober:
    """Builds the gateways once and sends probes; counts per endpoint and category."""

    def __init__(self, seed: int, workdir: Path) -> None:
        from tests.auth_support import (
            PEPPER,
            TEAMS,
            TENANCY_POLICY,
            build_gateway,
            jwt_auth,
            tenancy_corpus,
            write_api_keys,
        )
        from tests.unit.test_tenancy_properties import ADVERSARIAL

        self.rng = random.Random(seed)
        self.teams = TEAMS
        self.adversarial = ADVERSARIAL
        self.corpus = tenancy_corpus()
        # API keys: one per (team, role), with and without groups and permissions.
        self.key_identities: list[tuple[str, dict[str, Any]]] = []
        entries = []
        key_rng = random.Random(seed + 1)
        for team in TEAMS:
            for role in ("owner", "guardian", "service", "member", "guest"):
                identity = {
                    "sub": f"svc_{team}_{role}",
                    "teams": {team: [role]},
                    "groups": set(key_rng.sample(["ops", "board", "dev"], key_rng.randint(0, 2))),
                    "permissions": set(
                        key_rng.sample(["skill:read", "memory:read"], key_rng.randint(0, 1))
                    ),
                    "agent_id": key_rng.choice(["", "ag_1"]),
                }
                entries.append(
                    {
                        "sub": identity["sub"],
                        "teams": identity["teams"],
                        "groups": sorted(identity["groups"]),
                        "permissions": sorted(identity["permissions"]),
                        "agent_id": identity["agent_id"],
                    }
                )
                self.key_identities.append(("", identity))
        keys = write_api_keys(workdir / "api_keys.yaml", entries)
        self.key_identities = [
            (k, ident) for k, (_, ident) in zip(keys, self.key_identities, strict=True)
        ]
        auth = jwt_auth(api_keys_file=str(workdir / "api_keys.yaml"), api_key_pepper=PEPPER)
        corpus = self.corpus
        self.search_gw = build_gateway(auth=auth, policy=TENANCY_POLICY, corpus=corpus)
        self.ingest_gw = build_gateway(auth=auth, policy=TENANCY_POLICY, corpus=corpus)
        self.dev_gw = build_gateway(auth={"mode": "dev"}, policy=TENANCY_POLICY, corpus=corpus)
        self.dev_ingest_gw = build_gateway(
            auth={"mode": "dev"}, policy=TENANCY_POLICY, corpus=corpus
        )
        self.runs: Counter[tuple[str, str]] = Counter()
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.leaks: list[dict[str, Any]] = []
        self.server_errors: list[dict[str, Any]] = []
        self.checked_matches = 0

    def close(self) -> None:
        for gw in (self.search_gw, self.ingest_gw, self.dev_gw, self.dev_ingest_gw):
            gw.client.close()
            gw.service.audit.close()

    # --- random inputs -----------------------------------------------------------------------
    def adv(self) -> Any:
        r = self.rng.random()
        if r < 0.8:
            return self.rng.choice(self.adversarial)
        if r < 0.9:
            return "".join(chr(self.rng.randint(0, 0x2FFF)) for _ in range(self.rng.randint(0, 20)))
        return self.rng.choice([None, 7, [], {}, True, ["dao_a"], {"$ne": ""}])

    def maybe(self, normal: Any, noisy: bool) -> Any:
        """``normal`` (or a choice of it), else an adversarial value one time in five."""
        value = self.rng.choice(normal) if isinstance(normal, (list, tuple)) else normal
        return self.adv() if noisy and self.rng.random() < 0.2 else value

    def identity(self) -> dict[str, Any]:
        rng = self.rng
        teams: dict[str, list[str]] = {}
        for _ in range(rng.randint(1, 3)):
            team = rng.choice(self.teams) if rng.random() < 0.9 else str(self.adv())
            if 0 < len(team) <= 256 and "\x00" not in team:
                roles = ("member", "guest", "owner", "service", "guardian", "visitor")
                teams[team] = rng.sample(roles, rng.randint(1, 3))
        if not teams:
            teams = {rng.choice(self.teams): ["member"]}
        perms = ["skill:read", "memory:read"] + (["audit:read"] if rng.random() < 0.1 else [])
        return {
            "sub": rng.choice(["alice", "bob"]) if rng.random() < 0.9 else str(self.adv()) or "x",
            "teams": teams,
            "groups": set(rng.sample(["ops", "board", "dev"], rng.randint(0, 2))),
            "permissions": set(rng.sample(perms, rng.randint(0, len(perms)))),
            "agent_id": rng.choice(["", "ag_1", "ag_2"]),
        }

    def credential(self, kind: str, identity: dict[str, Any]) -> tuple[dict[str, str], Any]:
        """``(headers, identity the gateway should see)``; the identity is None for a
        credential that must be refused, and ``"dev"`` for development body trust."""
        from tests.auth_support import claims, hmac_token
        from tests.unit.test_tenancy_properties import token_for

        if kind == "dev_body_trust":
            return {}, "dev"
        if kind == "no_credential":
            return {}, None
        if kind == "api_key_valid":
            key, ident = self.rng.choice(self.key_identities)
            return {"x-api-key": key}, ident
        if kind == "api_key_other_team":
            # A valid key of some team; the request will name another team (see team()).
            key, ident = self.rng.choice(self.key_identities)
            return {"authorization": f"Bearer {key}"}, ident
        if kind == "api_key_unknown":
            return {"x-api-key": "rgk_" + "".join(self.rng.choices("abcdef0123", k=40))}, None
        if kind == "jwt_hs256_over_nothing":
            payload = claims(sub=identity["sub"], teams=identity["teams"])
            token = hmac_token(payload, b"", {"alg": "HS256", "typ": "JWT"})
        elif kind == "jwt_garbage":
            token = self.rng.choice(["not.a.token", "a.b.c", "....", str(self.adv())[:100]])
        else:
            # valid, expired, not_yet, wrong_aud, wrong_iss, forged, alg_none, cut: the same
            # token recipes as the property tests.
            token = token_for(identity, kind.removeprefix("jwt_"))
        if not token or any(c in token for c in "\r\n\x00") or not token.isascii():
            token = "not.a.token"
        ok = kind == "jwt_valid"
        return {"authorization": f"Bearer {token}"}, identity if ok else None

    def team(self, identity: Any, noisy: bool, other: bool) -> Any:
        granted = sorted(identity["teams"]) if isinstance(identity, dict) else []
        if other:
            foreign = [t for t in self.teams if t not in granted]
            return self.rng.choice(foreign or list(self.teams))
        if not granted or self.rng.random() < 0.15:
            return self.rng.choice(self.teams)
        return self.maybe(granted, noisy)

    # --- checks ------------------------------------------------------------------------------
    def record(self, endpoint: str, category: str, response: Any, problem: str | None) -> None:
        self.runs[(endpoint, category)] += 1
        self.statuses[(endpoint, response.status_code)] += 1
        if response.status_code >= 500:
            self.server_errors.append(
                {"endpoint": endpoint, "category": category, "body": response.text[:300]}
            )
        if problem:
            self.leaks.append(
                {
                    "endpoint": endpoint,
                    "category": category,
                    "status": response.status_code,
                    "problem": problem,
                }
            )

    def common_failure(self, expected: Any, response: Any) -> str | None:
        from tests.unit.test_tenancy_properties import MARKER

        if expected is None and response.status_code != 401:
            return f"bad credential answered {response.status_code}"
        if response.status_code != 200 and MARKER.findall(response.text):
            return f"markers in a {response.status_code} body"
        return None

    # --- probes ------------------------------------------------------------------------------
    def probe_search(self, kind: str) -> None:
        from tests.unit.test_tenancy_properties import MARKER, may_read

        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        noisy = rng.random() < 0.5
        body: dict[str, Any] = {
            "team_id": self.team(expected, noisy, kind == "api_key_other_team"),
            "query": self.maybe(QUERIES, noisy),
            "top_k": self.maybe([5, 50, 50], noisy),
        }
        if rng.random() < 0.3:
            body["user_id"] = self.maybe([identity["sub"], "mallory"], noisy)
        if rng.random() < 0.3:
            body["agent_id"] = self.maybe(["ag_1", "ag_2", ""], noisy)
        if rng.random() < 0.3:
            body["search_mode"] = self.maybe(["hybrid", "dense", "bm25"], noisy)
        if rng.random() < 0.6:
            filters: dict[str, Any] = {}
            for name, values in (
                ("project_id", ["", "prj_open", "prj_ops", "prj_board"]),
                ("channel_id", ["ch_1", ""]),
                ("agent_id", ["ag_1", ""]),
                ("visibility", ["public", "confidential"]),
            ):
                if rng.random() < 0.4:
                    filters[name] = self.maybe(values, noisy)
            if rng.random() < 0.5:
                filters["doc_type"] = [
                    self.maybe(DOC_TYPES, noisy) for _ in range(rng.randint(0, 3))
                ]
            if rng.random() < 0.3:
                filters["tags"] = [self.maybe(["milvus", "rag"], noisy) for _ in range(2)]
            if noisy and rng.random() < 0.1:
                filters["team_id"] = rng.choice(self.teams)  # must be refused (422)
            body["filters"] = filters
        mode = self.maybe(["confidential", "public", None], noisy)
        if mode is not None:
            body[rng.choice(["mode", "visibility"])] = mode
        gw = self.dev_gw if expected == "dev" else self.search_gw
        response = gw.search(body, **headers)
        problem = self.common_failure(expected, response)
        if response.status_code == 200 and problem is None:
            if expected == "dev":
                team = str(body["team_id"]).strip()
                ident = {"teams": {team: ["owner"]}, "groups": set(), "permissions": set()}
            else:
                ident = expected
            raw = str(body["team_id"])
            granted = {raw, raw.strip()} & set(ident["teams"])
            matches = response.json()["matches"]
            returned = {m["source_ref"]["team_id"] for m in matches}
            self.checked_matches += len(matches)
            if not granted:
                problem = f"200 for team {raw!r} not granted"
            elif not returned <= granted or len(returned) > 1:
                problem = f"matches of teams {sorted(returned - granted)}"
            else:
                team = next(iter(returned), raw.strip())
                conf = body.get("mode", body.get("visibility")) == "confidential"
                visible = {i for i, d in enumerate(self.corpus) if may_read(ident, team, conf, d)}
                leaked = {int(i) for i in MARKER.findall(response.text)} - visible
                ids = {m["source_ref"]["id"] for m in matches}
                allowed = {self.corpus[i]["doc_id"] for i in visible}
                if leaked:
                    problem = f"leaked {[self.corpus[i]['doc_id'] for i in sorted(leaked)]}"
                elif not ids <= allowed:
                    problem = f"ids not allowed: {sorted(ids - allowed)}"
        self.record(ENDPOINTS[0], kind, response, problem)

    def probe_ingest(self, kind: str) -> None:
        from tests.unit.test_tenancy_properties import may_write

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

    def probe_audit(self, kind: str) -> None:
        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        if expected == "dev":
            # Development body trust reads every team's audit outside production (documented);
            # probe it with a valid token instead.
            kind, (headers, expected) = "jwt_valid", self.credential("jwt_valid", identity)
        noisy = rng.random() < 0.5
        params: dict[str, Any] = {}
        if rng.random() < 0.85:
            params["team_id"] = self.team(expected, noisy, kind == "api_key_other_team")
        if rng.random() < 0.3:
            params["decision"] = self.maybe(["allow", "deny"], noisy)
        if rng.random() < 0.3:
            params["limit"] = self.maybe([1, 10, 500, 0, -1], noisy)
        if rng.random() < 0.2:
            params["subject"] = self.maybe(["alice", "bob"], noisy)
        params = {k: v for k, v in params.items() if isinstance(v, (str, int)) and v is not True}
        response = self.search_gw.client.get("/audit/decisions", params=params, headers=headers)
        problem = self.common_failure(expected, response)
        if problem is None and response.status_code == 200:
            team = params.get("team_id")
            everything = "audit:read" in expected["permissions"]
            roles = set(expected["teams"].get(str(team), ())) if team is not None else set()
            if not everything and not (team and "owner" in roles):
                problem = f"audit of team {team!r} readable without a reader role"
            elif not everything:
                others = {d.get("team_id") for d in response.json()["decisions"]} - {team}
                if others:
                    problem = f"audit records of teams {sorted(map(str, others))}"
        self.record(ENDPOINTS[2], kind, response, problem)

    def run(self, probes: int) -> None:
        kinds = [k for k, _ in CREDENTIALS]
        weights = [w for _, w in CREDENTIALS]
        endpoint_weights = [0.6, 0.25, 0.15]
        step = max(1, probes // 10)
        for i in range(probes):
            kind = self.rng.choices(kinds, weights)[0]
            which = self.rng.choices(range(3), endpoint_weights)[0]
            (self.probe_search, self.probe_ingest, self.probe_audit)[which](kind)
            if (i + 1) % step == 0:
                logger.info(
                    "%d/%d probes, %d leaks, %d server errors",
                    i + 1,
                    probes,
                    len(self.leaks),
                    len(self.server_errors),
                )


def run_probes(probes: int, seed: int = 0) -> dict[str, Any]:
    """Build the gateways, send ``probes`` probes; the counts, leaks and server errors."""
    with (
        tempfile.TemporaryDirectory(prefix="leak_probes_") as tmp,
        isolated_env(f"sqlite:///{Path(tmp) / 'audit.db'}"),
    ):
        prober = Prober(seed, Path(tmp))
        try:
            started = time.perf_counter()
            prober.run(probes)
            wall = time.perf_counter() - started
        finally:
            prober.close()
    per_endpoint: dict[str, dict[str, int]] = defaultdict(dict)
    for (endpoint, category), n in sorted(prober.runs.items()):
        per_endpoint[endpoint][category] = n
    leaks_by = Counter((leak["endpoint"], leak["category"]) for leak in prober.leaks)
    errors_by = Counter((e["endpoint"], e["category"]) for e in prober.server_errors)
    statuses: dict[str, dict[str, int]] = defaultdict(dict)
    for (endpoint, status), n in sorted(prober.statuses.items()):
        statuses[endpoint][str(status)] = n
    return {
        "probes": probes,
        "seed": seed,
        "wall_s": round(wall, 2),
        "probes_per_s": round(probes / wall, 1) if wall > 0 else None,
        "leaks_found": len(prober.leaks),
        "server_errors": len(prober.server_errors),
        "checked_matches": prober.checked_matches,
        "runs": {e: dict(c) for e, c in per_endpoint.items()},
        "statuses": {e: dict(s) for e, s in statuses.items()},
        "leaks_by": {f"{e} {c}": n for (e, c), n in leaks_by.items()},
        "server_errors_by": {f"{e} {c}": n for (e, c), n in errors_by.items()},
        "leaks": prober.leaks[:50],
        "server_error_samples": prober.server_errors[:20],
    }


def render_tables(result: dict[str, Any]) -> str:
    rows = []
    for endpoint in ENDPOINTS:
        cats = result["runs"].get(endpoint, {})
        for category, n in sorted(cats.items()):
            key = f"{endpoint} {category}"
            rows.append(
                [
                    endpoint,
                    category,
                    n,
                    result["leaks_by"].get(key, 0),
                    result["server_errors_by"].get(key, 0),
                ]
            )
    for endpoint in ENDPOINTS:
        statuses = result["statuses"].get(endpoint, {})
        total = sum(result["runs"].get(endpoint, {}).values())
        status_text = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
        rows.append([f"**{endpoint} total**", status_text, total, "", ""])
    rows.append(
        [
            "**all endpoints**",
            f"{result['checked_matches']} returned matches checked",
            result["probes"],
            result["leaks_found"],
            result["server_errors"],
        ]
    )
    return markdown_table(["endpoint", "category", "probes", "leaks", "5xx"], rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.leak_probes",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--probes", type=int, default=5000, help="probes to send (all endpoints)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe generator")
    p.add_argument("--out", default=None, help="result JSON (default bench/results/leaks-*.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    for noisy in ("serve_app", "deployments", "batch_ingest", "httpx2", "httpx"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    env = environment_info()
    result = run_probes(args.probes, args.seed)
    for leak in result["leaks"][:10]:
        logger.error("LEAK: %s", leak)
    for err in result["server_error_samples"][:5]:
        logger.error("SERVER ERROR: %s", err)
    write_result("leaks", {"environment": env, "args": vars(args), **result}, args.out)
    print(render_tables(result))
    print(
        f"\n{result['probes']} probes in {result['wall_s']} s: "
        f"{result['leaks_found']} leaks, {result['server_errors']} server errors"
    )
    return 1 if result["leaks_found"] or result["server_errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost of authentication and the access policy per request: a CPU micro-benchmark, in-process
(no Ray, no databases).

Measured per operation, each call timed with ``time.perf_counter_ns`` over ``--rounds`` rounds
of ``--calls`` calls (median of the round means, and p50/p95 of single calls), in µs:

a. authentication through the gateway's ``Authenticator`` (the code path of
   ``Authenticator.authenticate`` without the event loop: ``credential(headers)`` then
   ``_verify``): HS256 JWT, RS256 and ES256 JWT with a JWKS file, an API key (HMAC-SHA256 with
   pepper, from a key file);
b. ``AccessContext.for_caller`` + ``search_filter`` of a request with filters, with the packaged
   policy and with a policy of ``--projects`` project and ``--skills`` skill policies;
c. the result filter ``AccessContext.may_see`` over ``--hits`` hits;
d. the whole access path of one search (a + b + c) and its share of the gateway's measured
   search latency (``--gateway-p50-ms``, from bench/README.md);
e. POST /rag/search_docs through FastAPI's TestClient over fakes (serve_app.testing), auth
   mode ``jwt`` vs ``dev``: the difference is authentication + policy + the audit record's
   principal fields on the whole HTTP path.

    .venv/bin/python -m bench.bench_policy --help
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    environment_info,
    markdown_table,
    percentile,
    setup_logging,
    write_result,
)

logger = logging.getLogger("bench.policy")

# Gateway POST /rag/search_docs p50 at concurrency 1, 5,000 chunks, hybrid (bench/README.md,
# "Search latency on 5,000 chunks").
README_GATEWAY_P50_MS = 106.8


def measure(fn: Callable[[], Any], rounds: int, calls: int, warmup: int = 50) -> dict[str, Any]:
    """Time ``fn`` ``rounds × calls`` times; µs statistics."""
    for _ in range(warmup):
        fn()
    per_call: list[float] = []
    round_means: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        times = []
        for _ in range(calls):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        round_means.append(statistics.fmean(times) / 1000.0)
        per_call.extend(t / 1000.0 for t in times)
    return {
        "n": len(per_call),
        "median_round_mean_us": round(statistics.median(round_means), 2),
        "p50_us": round(percentile(per_call, 50), 2),
        "p95_us": round(percentile(per_call, 95), 2),
        "min_round_mean_us": round(min(round_means), 2),
        "max_round_mean_us": round(max(round_means), 2),
    }


def big_policy(projects: int, skills: int) -> Any:
    from serve_app.access.policy import Policy

    base = Policy.load()
    return Policy(
        confidential_roles=list(base.confidential_roles),
        write_roles=list(base.write_roles),
        doc_types={k: list(v) for k, v in base.doc_types.items()},
        projects=[
            {
                "project": f"prj_{i}",
                "team_id": "dao_a" if i % 2 else None,
                "access_level": ("group", "private", "public")[i % 3],
                "allowed_groups": ["ops", "dev"],
                "owner_group": "board",
                "required_permission": "proj:read" if i % 5 == 0 else None,
            }
            for i in range(projects)
        ],
        skills=[
            {
                "skill": f"SKILL-{i}",
                "access_level": "public",
                "required_permission": "skill:read",
            }
            for i in range(skills)
        ],
    )


def hits(n: int, team: str, with_resources: bool) -> list[Any]:
    from deployments.protocols import ChunkRecord

    out = []
    for i in range(n):
        out.append(
            ChunkRecord(
                chunk_id=f"c{i}",
                doc_id=f"SKILL-{i % 20}" if with_resources and i % 7 == 0 else f"d{i}",
                team_id=team if i % 10 else "dao_b",
                chunk_index=0,
                text="x",
                title="t",
                content_hash="h",
                embed_model="m",
                visibility="confidential" if i % 4 == 0 else "public",
                doc_type=("doc", "wiki", "message", "transaction")[i % 4],
                project_id=f"prj_{i % 50}" if with_resources and i % 3 == 0 else "",
                tags=("rag", "skill:SKILL-3") if with_resources and i % 5 == 0 else ("rag",),
            )
        )
    return out


def setup_auth(workdir: Path) -> dict[str, Any]:
    """An Authenticator of HS256 + JWKS file (RS256, ES256) + API key file; one credential
    header of each kind for a member of dao_a with groups and permissions."""
    from serve_app.auth.authenticator import Authenticator
    from serve_app.settings import GatewaySettings
    from serve_app.testing import (
        EC_KEY,
        PEPPER,
        RSA_KEY,
        claims,
        jwks,
        jwt_auth,
        mint,
        write_api_keys,
    )

    (workdir / "jwks.json").write_text(
        json.dumps(jwks((RSA_KEY, "rs1", "RS256"), (EC_KEY, "ec1", "ES256")))
    )
    teams = {"dao_a": ["member", "guardian"], "dao_c": ["guest"]}
    (key,) = write_api_keys(
        workdir / "keys.yaml",
        [{"teams": teams, "groups": ["ops"], "permissions": ["skill:read"], "agent_id": "ag_1"}],
    )
    auth = jwt_auth(
        jwks_file=str(workdir / "jwks.json"),
        api_keys_file=str(workdir / "keys.yaml"),
        api_key_pepper=PEPPER,
        token_cache_size=0,  # every call a full verification; the cached hit measured apart
    )
    settings = GatewaySettings(environment="test", auth=auth)
    authenticator = Authenticator.from_settings(settings)
    cached = Authenticator.from_settings(
        GatewaySettings(environment="test", auth={**auth, "token_cache_size": 4096})
    )
    payload = claims(
        teams=teams, groups=["ops"], permissions=["skill:read"], exp=int(time.time()) + 3600
    )
    headers = {
        "HS256 JWT": {"authorization": "Bearer " + mint(payload)},
        "RS256 JWT (JWKS file)": {
            "authorization": "Bearer " + mint(payload, key=RSA_KEY, alg="RS256", kid="rs1")
        },
        "ES256 JWT (JWKS file)": {
            "authorization": "Bearer " + mint(payload, key=EC_KEY, alg="ES256", kid="ec1")
        },
        "API key (HMAC-SHA256 + pepper)": {"x-api-key": key},
    }
    return {"authenticator": authenticator, "cached": cached, "headers": headers}


def bench_units(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from serve_app.access.context import AccessContext
    from serve_app.access.policy import Policy
    from serve_app.auth.authenticator import Authenticator
    from serve_app.search.contracts import SearchDocsRequest

    out: dict[str, Any] = {}
    a = setup_auth(workdir)
    authenticator = a["authenticator"]
    principals = {}
    for name, headers in a["headers"].items():

        def verify(headers: dict[str, str] = headers) -> Any:
            kind, value = Authenticator.credential(headers)
            return authenticator._verify(kind, value)

        principals[name] = verify()
        logger.info("authentication: %s", name)
        out[f"auth: {name}"] = measure(verify, args.rounds, args.calls)

    hs256 = a["headers"]["HS256 JWT"]

    def verify_cached() -> Any:
        kind, value = Authenticator.credential(hs256)
        return a["cached"]._verify(kind, value)

    out["auth: HS256 JWT, a hit of the verified-token cache"] = measure(
        verify_cached, args.rounds, args.calls
    )
    principal = principals["HS256 JWT"]
    body = {
        "team_id": "dao_a",
        "query": "Milvus gateway search notes",
        "top_k": 5,
        "mode": "confidential",
        "filters": {
            "project_id": "prj_3",
            "doc_type": ["doc", "wiki", "transaction"],
            "tags": ["rag", "milvus"],
            "visibility": "public",
            "channel_id": "ch_1",
        },
    }
    req = SearchDocsRequest.model_validate(body)
    out["request validation: SearchDocsRequest (pydantic)"] = measure(
        lambda: SearchDocsRequest.model_validate(body), args.rounds, args.calls
    )
    policies = {
        "packaged policy": Policy.load(),
        f"{args.projects} project + {args.skills} skill policies": big_policy(
            args.projects, args.skills
        ),
    }
    for label, policy in policies.items():
        logger.info("policy: %s", label)

        def context(policy: Policy = policy) -> AccessContext:
            return AccessContext.for_caller(
                principal,
                policy,
                team_id=req.team_id,
                user_id=req.user_id,
                agent_id=req.agent_id,
                visibility=req.visibility,
            )

        def scope(context: Any = context) -> Any:
            return context().search_filter(req.filters)

        scope()
        out[f"for_caller + search_filter ({label})"] = measure(scope, args.rounds, args.calls)
        ctx = context()
        batch = hits(args.hits, "dao_a", with_resources=True)

        def result_filter(ctx: AccessContext = ctx, batch: list = batch) -> Any:
            return [h for h in batch if ctx.may_see(h)]

        kept = len(result_filter())
        key = f"may_see over {args.hits} hits ({label})"
        out[key] = {**measure(result_filter, args.rounds, max(args.calls // 10, 10)), "kept": kept}
    return out


def bench_http(args: argparse.Namespace) -> dict[str, Any]:
    """POST /rag/search_docs through TestClient, jwt vs dev, interleaved."""
    from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus

    corpus = tenancy_corpus()
    jwt_gw = build_gateway(policy=TENANCY_POLICY, corpus=corpus)
    dev_gw = build_gateway(auth={"mode": "dev"}, policy=TENANCY_POLICY, corpus=corpus)
    payload = claims(
        teams={"dao_a": ["member", "guardian"]},
        groups=["ops"],
        permissions=["skill:read"],
        exp=int(time.time()) + 3600,
    )
    token = mint(payload)
    body = {
        "team_id": "dao_a",
        "query": "Milvus gateway search notes deploy budget",
        "top_k": 5,
        "mode": "confidential",
        "filters": {"doc_type": ["doc", "wiki", "message"], "tags": ["rag"]},
    }
    for _ in range(20):
        assert jwt_gw.search(body, token).status_code == 200
        assert dev_gw.search(body).status_code == 200
    times: dict[str, list[float]] = {"jwt": [], "dev": []}
    for _ in range(args.http_requests):
        for mode, call in (
            ("jwt", lambda: jwt_gw.search(body, token)),
            ("dev", lambda: dev_gw.search(body)),
        ):
            t0 = time.perf_counter_ns()
            resp = call()
            times[mode].append((time.perf_counter_ns() - t0) / 1000.0)
            if resp.status_code != 200:
                raise RuntimeError(f"{mode} search answered {resp.status_code}: {resp.text[:300]}")
    for gw in (jwt_gw, dev_gw):
        gw.client.close()
        gw.services.recorder.log.close()
    return {
        mode: {
            "n": len(t),
            "p50_us": round(percentile(t, 50), 1),
            "p95_us": round(percentile(t, 95), 1),
            "mean_us": round(statistics.fmean(t), 1),
        }
        for mode, t in times.items()
    }


def summarise(units: dict[str, Any], http: dict[str, Any], gateway_p50_ms: float) -> dict[str, Any]:
    label = next(k for k in units if k.startswith("for_caller") and "packaged" in k)
    label_big = next(k for k in units if k.startswith("for_caller") and "packaged" not in k)
    see = next(k for k in units if k.startswith("may_see") and "packaged" in k)
    see_big = next(k for k in units if k.startswith("may_see") and "packaged" not in k)
    out = {}
    for auth in ("HS256 JWT", "RS256 JWT (JWKS file)", "API key (HMAC-SHA256 + pepper)"):
        for scope, result in ((label, see), (label_big, see_big)):
            parts = [f"auth: {auth}", scope, result]
            total = sum(units[p]["median_round_mean_us"] for p in parts)
            p95 = sum(units[p]["p95_us"] for p in parts)
            policy = "packaged" if "packaged" in scope else scope.split("(")[1].rstrip(")")
            out[f"{auth} + scope + result filter ({policy})"] = {
                "sum_of_medians_us": round(total, 1),
                "sum_of_p95_us": round(p95, 1),
                "share_of_gateway_p50_pct": round(100.0 * total / (gateway_p50_ms * 1000.0), 3),
            }
    diff = http["jwt"]["p50_us"] - http["dev"]["p50_us"]
    out["HTTP jwt − dev (p50)"] = {
        "sum_of_medians_us": round(diff, 1),
        "sum_of_p95_us": round(http["jwt"]["p95_us"] - http["dev"]["p95_us"], 1),
        "share_of_gateway_p50_pct": round(100.0 * diff / (gateway_p50_ms * 1000.0), 3),
    }
    return out


def render_tables(result: dict[str, Any]) -> str:
    rows = [
        [
            name,
            r["n"],
            r["median_round_mean_us"],
            r["p50_us"],
            r["p95_us"],
            r.get("kept", "–"),
        ]
        for name, r in result["units"].items()
    ]
    units = markdown_table(
        ["operation", "calls", "median of round means µs", "p50 µs", "p95 µs", "hits kept"],
        rows,
    )
    http = result["http"]
    http_table = markdown_table(
        [
            "POST /rag/search_docs in-process (TestClient, fakes)",
            "requests",
            "p50 µs",
            "p95 µs",
            "mean µs",
        ],
        [
            [f"auth mode {m}", r["n"], r["p50_us"], r["p95_us"], r["mean_us"]]
            for m, r in http.items()
        ],
    )
    gw = result["gateway_p50_ms"]
    totals = markdown_table(
        [
            "access path per search request",
            "µs (medians summed)",
            "µs (p95 summed)",
            f"% of gateway p50 {gw} ms",
        ],
        [
            [k, v["sum_of_medians_us"], v["sum_of_p95_us"], v["share_of_gateway_p50_pct"]]
            for k, v in result["per_request"].items()
        ],
    )
    return "\n\n".join([units, totals, http_table])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_policy",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=20, help="rounds per operation")
    p.add_argument("--calls", type=int, default=1000, help="calls per round (may_see: a tenth)")
    p.add_argument("--hits", type=int, default=50, help="hits given to the result filter")
    p.add_argument("--projects", type=int, default=50, help="project policies of the big policy")
    p.add_argument("--skills", type=int, default=20, help="skill policies of the big policy")
    p.add_argument("--http-requests", type=int, default=500, help="HTTP requests per auth mode")
    p.add_argument(
        "--gateway-p50-ms",
        type=float,
        default=README_GATEWAY_P50_MS,
        help="gateway search p50 to compare with (bench/README.md, concurrency 1)",
    )
    p.add_argument("--out", default=None, help="result JSON (default bench/results/policy-*.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    from serve_app.testing import isolated_env

    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    for noisy in ("serve_app", "deployments", "batch_ingest", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING if noisy != "httpx2" else logging.ERROR)
    env = environment_info()
    if env["loadavg_start"][0] > 0.5 * (env["cpus"] or 1):
        logger.warning(
            "the machine is busy (load %s on %s CPUs)", env["loadavg_start"], env["cpus"]
        )
    with (
        tempfile.TemporaryDirectory(prefix="bench_policy_") as tmp,
        isolated_env(f"sqlite:///{Path(tmp) / 'audit.db'}"),
    ):
        units = bench_units(args, Path(tmp))
        logger.info("HTTP path: %d requests per auth mode", args.http_requests)
        http = bench_http(args)
    result = {
        "environment": env,
        "args": vars(args),
        "units": units,
        "http": http,
        "gateway_p50_ms": args.gateway_p50_ms,
        "per_request": summarise(units, http, args.gateway_p50_ms),
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    write_result("policy", result, args.out)
    print(render_tables(result))
    print(f"\nload average before {env['loadavg_start']}, after {result['loadavg_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

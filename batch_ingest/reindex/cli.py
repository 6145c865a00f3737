"""``python -m batch_ingest.reindex``: run (or resume) one team's reindex job, show the
team's latest job (``--status``), or clean up after jobs that will not finish
(``--clean-up``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

import batch_ingest.reindex as package
from batch_ingest.reindex.cleanup import clean_up
from batch_ingest.reindex.job import Reindexer, reindex
from batch_ingest.reindex.liveness import present
from batch_ingest.reindex.options import ReindexError, ReindexOptions
from batch_ingest.reindex.state import ReindexState
from batch_ingest.settings import BatchSettings
from batch_ingest.source_store import SourceStore
from deployments.tracing import LOG_FORMATS, configure_logging


def parse_resources(
    parser: argparse.ArgumentParser, given: list[str] | None
) -> dict[str, float] | None:
    """``NAME=AMOUNT`` flags as a dict (None when none given, so the settings apply)."""
    if not given:
        return None
    out: dict[str, float] = {}
    for item in given:
        name, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not sep or not name.strip() or not value > 0:
            parser.error(f"--actor-resource wants NAME=AMOUNT with AMOUNT > 0, got {item!r}")
        out[name.strip()] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m batch_ingest.reindex", description=package.__doc__
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--team", help="team_id to reindex")
    target.add_argument(
        "--outdated",
        action="store_true",
        help="reindex every team whose live version holds another embedding model's "
        "vectors than the configured one (after a change of the embedder's defaults; the "
        "gateway refuses such a team until then)",
    )
    parser.add_argument("--milvus-uri", help="overrides MILVUS__URI")
    parser.add_argument("--state-url", help="overrides STATE__URL (source registry + jobs)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--resume", action="store_true", help="continue the unfinished job")
    what.add_argument(
        "--status",
        action="store_true",
        help="print the team's latest job (a dead driver's job shows as stalled) and exit",
    )
    what.add_argument(
        "--clean-up",
        action="store_true",
        help="supersede the team's unfinished jobs whose driver is dead and drop their "
        "half-built versions (never the live one); prints what it dropped",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="reindex a team with no documents and no collection (else refused as unknown)",
    )
    parser.add_argument("--job-id", help="run this queued job (as submitted by the admin API)")
    parser.add_argument("--batch-size", type=int, help="documents per map_batches call")
    parser.add_argument("--actors", type=int, help="embedding actors in the Ray Data pool")
    parser.add_argument("--num-cpus", type=float, help="logical CPUs per actor (fractional)")
    parser.add_argument(
        "--actor-resource",
        action="append",
        metavar="NAME=AMOUNT",
        help="a custom Ray resource per actor, to place the pool on chosen nodes (repeatable)",
    )
    parser.add_argument("--engine", choices=("ray", "local"), default="ray")
    parser.add_argument(
        "--keep-previous", action="store_true", help="keep the replaced version for rollback"
    )
    parser.add_argument("--log-every", type=float, default=5.0, help="seconds between log lines")
    parser.add_argument("--settings-json", help="BatchSettings overrides as JSON")
    parser.add_argument(
        "--settings-stdin",
        action="store_true",
        help="read the BatchSettings overrides (JSON) from standard input: the admin API "
        "passes its own this way, so secrets are in neither argv nor the environment",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="json: one JSON object per log line (stderr)",
    )
    args = parser.parse_args(argv)
    configure_logging(
        args.log_format, text_format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    raw = sys.stdin.read() if args.settings_stdin else args.settings_json
    overrides: dict[str, Any] = json.loads(raw) if raw else {}
    if args.milvus_uri:
        overrides["milvus"] = {**overrides.get("milvus", {}), "uri": args.milvus_uri}
    if args.state_url:
        overrides["state"] = {**overrides.get("state", {}), "url": args.state_url}
    settings = BatchSettings(**overrides)
    if args.outdated:
        return reindex_outdated(settings, args.engine)
    if args.status:
        state = ReindexState(SourceStore(settings.state.url).engine)
        job = state.latest(args.team)
        shown = present(job, settings.reindex.stale_after_s).public() if job else None
        print(json.dumps({"team_id": args.team, "job": shown}))
        return 0
    if args.clean_up:
        reindexer = Reindexer(settings)
        report = clean_up(
            reindexer.state, reindexer.versions, args.team, settings.reindex.stale_after_s
        )
        print(json.dumps(asdict(report)))
        return 0
    options = ReindexOptions.from_settings(
        args.team,
        settings.reindex,
        resume=args.resume,
        job_id=args.job_id,
        batch_size=args.batch_size,
        actors=args.actors,
        num_cpus_per_actor=args.num_cpus,
        actor_resources=parse_resources(parser, args.actor_resource),
        engine=args.engine,
        keep_previous=args.keep_previous or None,
        log_every_s=args.log_every,
        allow_empty=args.allow_empty or None,
    )
    try:
        result = reindex(settings, options)
    except ReindexError as exc:
        print(f"reindex failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({**result.job.public(), "dropped_versions": result.dropped_versions}))
    return 0


def reindex_outdated(settings: BatchSettings, engine: str) -> int:
    """Reindex, one after another, the teams of the source registry whose live version
    holds vectors of a model other than ``settings``' (the one a reindex embeds with)."""
    from deployments.models.embedding import embedding_dim
    from deployments.vector_store.store import MilvusStore

    tag = settings.reindex_embedder.embed_model_tag
    store = MilvusStore(settings.milvus, dim=embedding_dim(settings.reindex_embedder))
    store.start()
    try:
        outdated = [
            (team, model)
            for team in SourceStore(settings.state.url).teams()
            if (model := store.live_model(team)) not in (None, tag)
        ]
    finally:
        store.close()
    if not outdated:
        print(f"every team's index holds {tag} vectors: nothing to reindex")
        return 0
    failed = 0
    for i, (team, model) in enumerate(outdated, 1):
        print(f"[{i}/{len(outdated)}] {team}: {model} -> {tag}", flush=True)
        options = ReindexOptions.from_settings(team, settings.reindex, engine=engine)
        try:
            result = reindex(settings, options)
        except Exception as exc:  # the next team may still succeed: try every one
            print(f"reindex of {team} failed: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(json.dumps(result.job.public()), flush=True)
    return 1 if failed else 0

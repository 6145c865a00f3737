"""Deterministic synthetic corpus for the benchmarks.

``generate_corpus(n_docs, n_tenants, seed)`` returns ``SourceDocument``-shaped dicts of
100–140 English words each (~155 MiniLM tokens on average, at most 200), built from topic
vocabularies and sentence templates. Document ``i`` depends only on ``(seed, i)`` and the
arguments that shape it, so a corpus of 5,000 starts with the corpus of 300. With the default
words range every document is exactly one chunk under the default chunking (200 tokens; checked
for the first 5,000 documents of seed 0); the benchmarks count chunks from the ingestion
responses anyway.

    python -m bench.corpus --docs 5 --tenants 2          # print a few documents as JSONL
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

# Topic vocabularies: nouns, then adjectives, then verbs.
TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "energy": (
        (
            "inverter",
            "battery",
            "panel",
            "substation",
            "meter",
            "turbine",
            "grid",
            "feeder",
            "transformer",
            "charger",
            "rooftop",
            "storage",
        ),
        ("solar", "peak", "reactive", "nominal", "seasonal", "curtailed", "backup", "hourly"),
        ("generates", "exports", "balances", "discharges", "charges", "trips", "feeds"),
    ),
    "food": (
        (
            "batch",
            "harvest",
            "warehouse",
            "pallet",
            "honey",
            "buckwheat",
            "cheese",
            "orchard",
            "dairy",
            "cooperative",
            "lab",
            "label",
        ),
        ("organic", "chilled", "fresh", "certified", "seasonal", "local", "dried", "frozen"),
        ("ships", "stores", "tests", "packs", "delivers", "recalls", "labels"),
    ),
    "governance": (
        (
            "proposal",
            "quorum",
            "vote",
            "treasury",
            "member",
            "council",
            "budget",
            "grant",
            "charter",
            "delegate",
            "ballot",
            "mandate",
        ),
        ("binding", "quarterly", "open", "weighted", "majority", "emergency", "annual"),
        ("approves", "rejects", "funds", "amends", "delegates", "ratifies", "audits"),
    ),
    "software": (
        (
            "index",
            "replica",
            "cluster",
            "query",
            "schema",
            "stream",
            "consumer",
            "subject",
            "embedding",
            "collection",
            "gateway",
            "endpoint",
        ),
        ("distributed", "idempotent", "durable", "async", "sparse", "dense", "hybrid"),
        ("indexes", "replicates", "streams", "batches", "retries", "deploys", "scales"),
    ),
    "logistics": (
        (
            "truck",
            "route",
            "driver",
            "depot",
            "shipment",
            "invoice",
            "customs",
            "container",
            "schedule",
            "loader",
            "parcel",
            "dock",
        ),
        ("delayed", "express", "refrigerated", "overnight", "regional", "bonded", "urgent"),
        ("dispatches", "loads", "reroutes", "tracks", "unloads", "clears", "invoices"),
    ),
    "finance": (
        (
            "token",
            "revenue",
            "dividend",
            "ledger",
            "swap",
            "reserve",
            "payout",
            "fee",
            "audit",
            "custodian",
            "valuation",
            "asset",
        ),
        ("quarterly", "audited", "liquid", "pending", "net", "projected", "tokenized"),
        ("distributes", "settles", "accrues", "reconciles", "values", "allocates", "books"),
    ),
    "agents": (
        (
            "agent",
            "assistant",
            "prompt",
            "citation",
            "snippet",
            "answer",
            "channel",
            "summary",
            "workflow",
            "tool",
            "memory",
            "report",
        ),
        ("helpful", "grounded", "concise", "autonomous", "scheduled", "cited", "daily"),
        ("answers", "summarises", "drafts", "routes", "quotes", "searches", "flags"),
    ),
    "climate": (
        (
            "forecast",
            "storm",
            "rainfall",
            "drought",
            "frost",
            "heatwave",
            "humidity",
            "wind",
            "season",
            "soil",
            "irrigation",
            "sensor",
        ),
        ("cloudy", "humid", "dry", "windy", "mild", "extreme", "early", "late"),
        ("threatens", "delays", "damages", "measures", "predicts", "cools", "floods"),
    ),
}

COMMON_NOUNS = ("team", "week", "plan", "site", "record", "result", "partner", "region")
PLACES = ("Kyiv", "Lviv", "Poltava", "Zhytomyr", "Odesa", "Vinnytsia", "Chernihiv", "Rivne")
AGENTS = ("daarwizz", "helion", "")
CHANNELS = ("general", "operations", "logistics", "sales", "governance", "ops-alerts")
DOC_TYPES = ("doc", "wiki", "message", "file", "rwa")

TEMPLATES = (
    "The {adj} {noun} {verb} the {noun2} near {place}.",
    "Our {common} {verb} every {adj} {noun} before the {noun2} is closed.",
    "In {place} the {noun} {verb} {adj} {noun2} twice a {common}.",
    "A {adj} {noun} and the {noun2} were reviewed by the {common} on {day}.",
    "The {common} agreed that the {noun} {verb} only when the {noun2} is {adj}.",
    "Each {noun} has a {adj} {noun2}, and the {common} {verb} it by {day}.",
    "We noted that the {adj} {noun} in {place} {verb} more than last {common}.",
    "Please check whether the {noun2} {verb} the {adj} {noun} after {day}.",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "the weekend")
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


def tenant_ids(n_tenants: int, prefix: str = "bench_t") -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(n_tenants)]


def _sentence(rng: random.Random, topic: str) -> str:
    nouns, adjs, verbs = TOPICS[topic]
    template = rng.choice(TEMPLATES)
    return template.format(
        adj=rng.choice(adjs),
        noun=rng.choice(nouns),
        noun2=rng.choice(nouns),
        verb=rng.choice(verbs),
        place=rng.choice(PLACES),
        common=rng.choice(COMMON_NOUNS),
        day=rng.choice(DAYS),
    )


def make_text(rng: random.Random, topic: str, min_words: int, max_words: int) -> str:
    """Sentences mostly from ``topic`` (one in five from another topic) until the target."""
    target = rng.randint(min_words, max_words)
    others = [t for t in TOPICS if t != topic]
    sentences: list[str] = []
    words = 0
    while words < target:
        sentence = _sentence(rng, topic if rng.random() < 0.8 else rng.choice(others))
        n = len(sentence.split())
        if sentences and words + n > max_words and words >= min_words:
            break
        sentences.append(sentence)
        words += n
    return " ".join(sentences)


def make_document(
    i: int,
    *,
    n_tenants: int,
    seed: int = 0,
    min_words: int = 100,
    max_words: int = 140,
    tenant_prefix: str = "bench_t",
    doc_prefix: str = "doc",
    confidential_share: float = 0.2,
) -> dict[str, Any]:
    """Document ``i`` of the corpus: a dict with exactly the fields of ``SourceDocument``."""
    rng = random.Random(f"{seed}:{i}")
    topic = rng.choice(list(TOPICS))
    nouns, adjs, _ = TOPICS[topic]
    tenant = tenant_ids(n_tenants, tenant_prefix)[i % n_tenants]
    doc_id = f"{doc_prefix}-{i:07d}"
    created = EPOCH + timedelta(seconds=rng.randrange(0, 2 * 365 * 86400))
    return {
        "team_id": tenant,
        "doc_id": doc_id,
        "title": f"{rng.choice(adjs).capitalize()} {rng.choice(nouns)} {topic} note {i}",
        "text": make_text(rng, topic, min_words, max_words),
        "url": f"https://bench.example/{tenant}/{doc_id}",
        "project_id": f"proj_{topic}",
        "channel_id": rng.choice(CHANNELS),
        "agent_id": rng.choice(AGENTS),
        "visibility": "confidential" if rng.random() < confidential_share else "public",
        "doc_type": rng.choice(DOC_TYPES),
        "tags": sorted({topic, rng.choice(nouns)}),
        "created_at": created.isoformat().replace("+00:00", "Z"),
    }


def generate_corpus(
    n_docs: int,
    n_tenants: int,
    seed: int = 0,
    *,
    min_words: int = 100,
    max_words: int = 140,
    tenant_prefix: str = "bench_t",
    doc_prefix: str = "doc",
    start: int = 0,
) -> list[dict[str, Any]]:
    """Documents ``start`` … ``start + n_docs - 1``, spread round-robin over the tenants."""
    if n_tenants < 1:
        raise ValueError("n_tenants must be at least 1")
    return [
        make_document(
            i,
            n_tenants=n_tenants,
            seed=seed,
            min_words=min_words,
            max_words=max_words,
            tenant_prefix=tenant_prefix,
            doc_prefix=doc_prefix,
        )
        for i in range(start, start + n_docs)
    ]


def make_queries(
    n: int, n_tenants: int, seed: int = 0, *, tenant_prefix: str = "bench_t"
) -> list[tuple[str, str]]:
    """``(team_id, query)`` pairs: 2–4 words of one topic's vocabulary, a random tenant."""
    rng = random.Random(f"queries:{seed}")
    tenants = tenant_ids(n_tenants, tenant_prefix)
    out = []
    for _ in range(n):
        topic = rng.choice(list(TOPICS))
        nouns, adjs, verbs = TOPICS[topic]
        words = [rng.choice(adjs), rng.choice(nouns)]
        if rng.random() < 0.6:
            words.append(rng.choice(verbs))
        if rng.random() < 0.4:
            words.append(rng.choice(nouns))
        out.append((rng.choice(tenants), " ".join(words)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print a synthetic corpus as JSONL.")
    parser.add_argument("--docs", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-words", type=int, default=100)
    parser.add_argument("--max-words", type=int, default=140)
    args = parser.parse_args(argv)
    for doc in generate_corpus(
        args.docs, args.tenants, args.seed, min_words=args.min_words, max_words=args.max_words
    ):
        sys.stdout.write(json.dumps(doc) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

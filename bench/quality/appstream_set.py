"""A labeled set from the Debian AppStream catalogue (DEP-11 ``Components-amd64.yml.gz``,
shipped with the Debian package lists of this machine's registry).

Documents: each software component's English description (``Description``, HTML stripped),
titled with its name. Queries: the component's one-line English ``Summary`` ("SMS/MMS
messaging client"), which paraphrases rather than repeats its description — the short,
intent-like question an agent asks. Relevant: the component, and every other component with
the same description text (alternative packagings of one program). With ``lang="uk"`` the
queries are the Ukrainian summaries where the catalogue has one (a multilingual embedder's
set).
"""

from __future__ import annotations

import glob
import gzip
import html
import random
import re
from typing import Any

import yaml

from bench.quality.bible_set import LabeledSet

CATALOGUE_GLOB = "/var/lib/apt/lists/*_dists_*_main_dep11_Components-amd64.yml.gz"
TAG = re.compile(r"<[^>]+>")
SPACE = re.compile(r"\s+")


def catalogue_path() -> str:
    found = sorted(glob.glob(CATALOGUE_GLOB))
    if not found:
        raise SystemExit(
            "no DEP-11 catalogue under /var/lib/apt/lists (run `apt-get update` on Debian)"
        )
    # The main suite (not -updates/-security), which holds the whole catalogue.
    return min(found, key=len)


def plain(text: str) -> str:
    return SPACE.sub(" ", html.unescape(TAG.sub(" ", text))).strip()


def components(path: str | None = None) -> list[dict[str, Any]]:
    with gzip.open(path or catalogue_path(), "rt", encoding="utf-8") as fh:
        docs = list(yaml.safe_load_all(fh))
    return [d for d in docs[1:] if isinstance(d, dict) and d.get("ID")]


def build(
    n_queries: int = 300,
    n_dev: int = 100,
    team_id: str = "bench_quality_t0",
    seed: int = 13,
    lang: str = "en",
    extra_test: bool = False,
) -> LabeledSet:
    """``n_queries`` summaries drawn with ``seed``, the first ``n_dev`` of them dev. With
    ``extra_test`` every other component that has a summary is a test query too: the dev
    queries stay exactly those of the default draw (nothing tuned on them leaks into test)."""
    out = LabeledSet(name=f"appstream-summary-{lang}")
    by_text: dict[str, list[str]] = {}
    summaries: dict[str, str] = {}
    seen: set[str] = set()
    for comp in components():
        desc = (comp.get("Description") or {}).get("C")
        summary = (comp.get("Summary") or {}).get("uk" if lang == "uk" else "C")
        name = (comp.get("Name") or {}).get("C") or comp["ID"]
        if not desc:
            continue
        doc_id = comp["ID"]
        if doc_id in seen:
            continue
        seen.add(doc_id)
        text = plain(desc)
        if len(text.split()) < 8:
            continue
        out.documents.append(
            {
                "team_id": team_id,
                "doc_id": doc_id,
                "doc_type": "doc",
                "title": plain(name)[:300],
                "text": text,
                "tags": [str(comp.get("Type") or "component")],
            }
        )
        by_text.setdefault(text.lower(), []).append(doc_id)
        if summary and len(plain(summary).split()) >= 3:
            summaries[doc_id] = plain(summary)
    text_of = {d["doc_id"]: d["text"].lower() for d in out.documents}
    candidates = sorted(summaries)
    rng = random.Random(seed)
    picked = rng.sample(candidates, min(n_queries, len(candidates)))
    if extra_test:
        drawn = set(picked)
        picked += [c for c in candidates if c not in drawn]
    for i, doc_id in enumerate(picked):
        qid = f"q{i:04d}"
        out.queries[qid] = summaries[doc_id]
        out.qrels[qid] = {d: 1 for d in by_text[text_of[doc_id]]}
        (out.dev if i < n_dev else out.test).append(qid)
    return out

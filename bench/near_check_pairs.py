"""Which near-duplicate query pairs the semantic cache's lexical check serves (issue 38, item 7).

Offline, no gateway: the query embeddings of the AppStream summaries (every component's, as
queried by ``bench_agent_tools``) and of the Bible WEB and KJV wordings of the verses of
``--books`` (``bench.realtext``, cached on disk), every pair of distinct normalised texts
within one set whose cosine is at least ``--similarity`` (the cache's near-duplicate
threshold), and per pair: whether the two queries want the same answer (their relevant
documents are the same set), the multiset Jaccard of their content words and whether their
protected terms (numbers, negations) agree (``serve_app/search/cache/wording.py``). The table: per
Jaccard threshold, the pairs the check would serve — with the same answer wanted, and with
another — to choose ``cache.near_min_jaccard`` on data.

    .venv/bin/python -m bench.near_check_pairs [--similarity 0.95]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from bench import realtext
from bench.common import markdown_table, setup_logging, write_result
from bench.quality import appstream_set, bible_set
from bench.quality.bible_set import DEFAULT_BOOKS
from serve_app.search.cache import wording
from serve_app.search.cache.semantic import normalise
from serve_app.settings import GatewaySettings

THRESHOLDS = (1.0, 0.9, 0.8, 0.75, 0.67, 0.6, 0.5)


def pairs_of(
    texts: list[str], wanted: list[frozenset[str]], vectors: np.ndarray, similarity: float
) -> list[dict[str, Any]]:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ unit.T
    out = []
    for i, j in zip(*np.nonzero(np.triu(sims, 1) >= similarity), strict=True):
        a, b = wording.terms(texts[i]), wording.terms(texts[j])
        out.append(
            {
                "a": texts[i],
                "b": texts[j],
                "cosine": round(float(sims[i, j]), 4),
                "same_answer": wanted[i] == wanted[j],
                "protected_agree": a.protected == b.protected and not a.empty and not b.empty,
                "jaccard": round(wording.jaccard(a.words, b.words), 4),
            }
        )
    return out


def load(books: tuple[str, ...]) -> dict[str, tuple[list[str], list[frozenset[str]]]]:
    """Per set: the distinct normalised query texts and the relevant documents of each (the
    union over the labels asking that text)."""
    apps = appstream_set.build(extra_test=True)
    bible = bible_set.build("paraphrase", books)
    kjv = {d["doc_id"]: d["text"] for d in bible.documents}
    out = {}
    for name, items in (
        ("appstream", [(apps.queries[q], set(apps.qrels[q])) for q in apps.queries]),
        (
            "bible web+kjv",
            [(bible.queries[q], set(bible.qrels[q])) for q in bible.queries]
            + [(kjv[d], set(bible.qrels[q])) for q in bible.queries for d in bible.qrels[q]],
        ),
    ):
        by_text: dict[str, set[str]] = {}
        for text, rel in items:
            by_text.setdefault(normalise(text), set()).update(rel)
        texts = sorted(by_text)
        out[name] = (texts, [frozenset(by_text[t]) for t in texts])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--similarity", type=float, default=0.95)
    p.add_argument("--books", default=",".join(DEFAULT_BOOKS))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    setup_logging(False)
    settings = GatewaySettings()
    result: dict[str, Any] = {"benchmark": "near_check_pairs", "similarity": args.similarity}
    rows = []
    for name, (texts, wanted) in load(tuple(args.books.split(","))).items():
        vectors = realtext.embed_texts(texts, settings, kind="query", name=f"near-{name[:5]}")
        pairs = pairs_of(texts, wanted, vectors, args.similarity)
        result[name] = {"texts": len(texts), "pairs": pairs}
        same = sum(p["same_answer"] for p in pairs)
        rows.append([name, len(texts), "cosine only", f"{same} / {len(pairs) - same}"])
        for t in THRESHOLDS:
            served = [p for p in pairs if p["protected_agree"] and p["jaccard"] >= t]
            good = sum(p["same_answer"] for p in served)
            rows.append(
                [name, len(texts), f"lexical, Jaccard ≥ {t:g}", f"{good} / {len(served) - good}"]
            )
    table = markdown_table(
        ["set", "distinct texts", "served", "pairs served: same answer / another answer"], rows
    )
    result["table_markdown"] = table
    write_result("near_check_pairs", result, args.out)
    print(table)
    for name in ("appstream", "bible web+kjv"):
        wrong = [p for p in result[name]["pairs"] if not p["same_answer"]][:15]
        print(name, json.dumps(wrong, ensure_ascii=False, indent=None)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

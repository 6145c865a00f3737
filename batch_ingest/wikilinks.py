"""``[[wiki-links]]`` of Markdown notes (Obsidian style) and the keys they resolve by.

A link ``[[Folder/Note Name#Heading|shown text]]`` targets the note ``Note Name``: the key is
the last path segment without heading, alias or ``.md``, lower-cased, with runs of spaces,
underscores and dashes made one dash. A document answers to the key of its ``doc_id``'s last
segment and to the key of its title, so ``[[kubectl]]`` finds ``tools/kubectl.md`` and a note
titled "Kubectl"; a note's link to its own key (``[[Own title]]`` in "Own title") is a link to
itself (a ``LINKS_TO`` self-loop, not a placeholder: deployments/graph_store/cypher.py). Links
inside code spans and fenced code blocks are not links.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[\[([^\[\]\n]+?)\]\]")
_SEP = re.compile(r"[\s_\-]+")
MAX_LINKS = 200
MAX_KEY = 200


def wiki_key(target: str) -> str:
    """The resolution key of a link target or a document name ('' when nothing is left)."""
    name = target.split("|", 1)[0].split("#", 1)[0].strip()
    name = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if name.lower().endswith(".md"):
        name = name[:-3]
    return _SEP.sub("-", name.strip().lower()).strip("-")[:MAX_KEY]


def extract_links(text: str) -> tuple[str, ...]:
    """Distinct link keys of ``text`` in order of first appearance (at most ``MAX_LINKS``).
    Embeds (``![[image.png]]``) count as links too: the note depends on the file."""
    text = _CODE.sub(" ", _FENCE.sub(" ", text))
    keys: dict[str, None] = {}
    for match in _LINK.finditer(text):
        key = wiki_key(match.group(1))
        if key:
            keys.setdefault(key, None)
            if len(keys) >= MAX_LINKS:
                break
    return tuple(keys)

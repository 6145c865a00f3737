"""The benchmark's HTTP client, one of two (``--client``): ``httpx`` (pure-Python HTTP/1.1
parsing, h11; what many agent routers call with, the OpenAI SDK among them) or ``aiohttp``
(its C parser). Against a plain uvicorn app answering 14 KB of JSON on this 2-vCPU VM, a
round trip cost ~1.1 ms through httpx and ~0.33 ms through aiohttp: the instrument's own
share of a measured p50, which the gateway does not spend (bench/README.md, "eleventh pass").

Both are used through what the benchmarks read: ``post(path, json=, headers=)`` and
``get(path, headers=)`` answering an object with ``status_code``, ``headers`` (case-blind),
``text``, ``json()`` and ``raise_for_status()``.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

CLIENTS = ("httpx", "aiohttp")


@dataclass(frozen=True)
class Answer:
    """An aiohttp response read whole, shaped like the httpx response the benchmarks read."""

    status_code: int
    headers: Any  # aiohttp's CIMultiDictProxy: get() ignores case, as httpx's headers do
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self.text[:300]}")


class AiohttpClient:
    def __init__(self, session: Any) -> None:
        self.session = session

    async def post(self, path: str, json: Any = None, headers: dict | None = None) -> Answer:
        async with self.session.post(path, json=json, headers=headers) as resp:
            return Answer(resp.status, resp.headers, await resp.read())

    async def get(self, path: str, headers: dict | None = None) -> Answer:
        async with self.session.get(path, headers=headers) as resp:
            return Answer(resp.status, resp.headers, await resp.read())


@asynccontextmanager
async def open_client(
    kind: str, base_url: str, timeout: float, max_connections: int
) -> AsyncIterator[Any]:
    """A client of ``kind`` (one of ``CLIENTS``) on ``base_url``, keeping its connections."""
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=max_connections)
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as c:
            yield c
    elif kind == "aiohttp":
        import aiohttp

        async with aiohttp.ClientSession(
            base_url=base_url,
            timeout=aiohttp.ClientTimeout(total=timeout),
            connector=aiohttp.TCPConnector(limit=max_connections),
        ) as session:
            yield AiohttpClient(session)
    else:
        raise ValueError(f"unknown client {kind!r}: one of {', '.join(CLIENTS)}")

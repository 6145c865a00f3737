"""Single search queries sent to the Embedder deployment while one such call is on its way go
together in the next call.

``SplitEmbedder`` hands a search's query to the Embedder deployment while the ingress is
busy (``embedder.query_spill``). Each went as a call of one text, and the Embedder's query
queue does not wait (``query_batch_wait_timeout_s`` 0, so a lone search pays nothing): its
batches were whatever arrived during the previous forward pass, near one text, where a torch
MiniLM pass over 8 queries costs about half as much per query as 8 passes of one on a 2-vCPU
node (bench/README.md, "Two CPUs"). ``CoalescedQueries`` keeps at most ``max_calls`` calls on
their way: a query arriving while they are waits for one to come back and goes with every
other query that waited, as one call of several texts, which the Embedder embeds in one pass. A
lone query goes at once, as before. A caller that gives up (its deadline) leaves its text to
be embedded with the others and its answer unread; a failed call fails each of its queries.
"""

from __future__ import annotations

import asyncio
from typing import Any

from deployments.protocols import Encoded


class CoalescedQueries:
    """``encode(text)`` through ``target.encode(texts, "query")``, coalescing concurrent calls.

    Args:
        target: the shared embedder (the Embedder deployment's handle wrapper).
        max_calls: calls on their way at once, per ingress replica: with one, the Embedder
            idled while an answer travelled back (torch MiniLM, c=8 on 2 vCPUs: 36.7 req/s
            against 39.9 with a call per query); with two, one batch waits in its queue
            while the other runs (47.8); with three, batches got smaller (43.3).
        max_texts: most texts in one call.
    """

    def __init__(self, target: Any, max_calls: int = 2, max_texts: int = 32) -> None:
        self.target = target
        self.max_calls = max_calls
        self.max_texts = max_texts
        self._waiting: list[tuple[str, asyncio.Future[Encoded]]] = []
        self._calls = 0
        self.sent_calls = 0
        self.sent_texts = 0

    async def encode(self, text: str) -> Encoded:
        future: asyncio.Future[Encoded] = asyncio.get_running_loop().create_future()
        self._waiting.append((text, future))
        if self._calls < self.max_calls:
            self._calls += 1
            asyncio.get_running_loop().create_task(self._send())
        return await future

    async def _send(self) -> None:
        """Send what waits, as one call, until nothing does."""
        try:
            while self._waiting:
                batch = self._waiting[: self.max_texts]
                del self._waiting[: self.max_texts]
                self.sent_calls += 1
                self.sent_texts += len(batch)
                try:
                    encoded = await self.target.encode([t for t, _ in batch], "query")
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # cancelled (the replica stops): so are its callers
                    for _, future in batch + self._waiting:
                        future.cancel()
                    self._waiting.clear()
                    raise
                for j, (_, future) in enumerate(batch):
                    if not future.done():
                        future.set_result(encoded.part(j, j + 1))
        finally:
            self._calls -= 1

    def status(self) -> dict[str, float]:
        return {
            "calls": self.sent_calls,
            "texts_per_call": round(self.sent_texts / self.sent_calls, 2) if self.sent_calls else 0,
        }

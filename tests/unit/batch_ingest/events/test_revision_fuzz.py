"""Revision fuzz (issue 34's target): huge, negative, equal and older revisions, in random
batches, some of them hitting a registry that cannot be written. Never is a batch with a
failed registry write acknowledged as applied, never does an older revision win over a newer
one, and after the redeliveries every document holds its newest valid revision."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_ingest.events import apply_events, parse_event
from batch_ingest.events.envelope import MAX_REVISION
from tests.unit.batch_ingest.events.test_events import TEAM, delete, fake_pipeline, upsert

DOCS = ("d0", "d1", "d2")
ACKED = {"indexed", "deleted"}

revisions = st.one_of(
    st.integers(0, 40),  # ordinary, often equal or older than one already seen
    st.sampled_from([MAX_REVISION, MAX_REVISION + 1, 2**63, 2**64, -1, -(2**63)]),
)
events = st.lists(
    st.tuples(st.sampled_from(DOCS), st.booleans(), revisions), min_size=1, max_size=14
)


def raw(doc_id: str, is_delete: bool, revision: int) -> dict:
    if is_delete:
        return delete(doc_id, revision)
    return upsert(doc_id, f"{doc_id} at revision {revision}", revision=revision)


def _broken(*args, **kwargs):
    raise OverflowError("Python int too large to convert to SQLite INTEGER")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=events, cuts=st.lists(st.integers(1, 4), max_size=8), broken=st.data())
def test_no_failed_registry_write_is_acked_and_the_newest_revision_wins(events, cuts, broken):
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = fake_pipeline(Path(tmp))
        # Distinct content per (doc, revision): an equal revision is the same event again.
        pending = [parse_event(raw(*e)) for e in events]
        batches, i = [], 0
        for size in [*cuts, len(pending)]:
            if i < len(pending):
                batches.append(pending[i : i + size])
                i += size
        retry = []
        for batch in batches:
            down = broken.draw(st.booleans(), label="registry down")
            if down:
                pipeline.sources.put = _broken
                pipeline.sources.tombstone = _broken
            results, _ = asyncio.run(apply_events(pipeline, batch))
            if down:
                del pipeline.sources.put, pipeline.sources.tombstone
            for ev, r in zip(batch, results, strict=True):
                if r.status == "invalid":
                    continue
                if down:
                    assert r.status not in ACKED, r  # the consumer would ack it
                if r.status == "failed":
                    assert r.retryable, r
                    retry.append(ev)
        # The bus redelivers what failed, in order, until nothing fails.
        results, _ = asyncio.run(apply_events(pipeline, retry)) if retry else ([], [])
        assert all(r.status != "failed" for r in results), results
        valid = [e for e in events if 0 <= e[2] <= MAX_REVISION]
        for doc_id in DOCS:
            mine = [e for e in valid if e[0] == doc_id]
            row = pipeline.sources.get((TEAM, "doc", doc_id))
            stored = sorted(c.text for c in pipeline.store.rows.values() if c.doc_id == doc_id)
            if not mine:
                assert row is None and not stored
                continue
            newest = max(rev for _, _, rev in mine)
            assert row is not None and row.version == newest, (doc_id, row, mine)
            # Events of the newest revision: whichever was applied first wins (a redelivery
            # may reorder them), the others are "unchanged"; a producer that gives one
            # revision two contents gets one of them.
            kinds = {d for _, d, rev in mine if rev == newest}
            assert row.deleted in kinds, (doc_id, row, mine)
            if row.deleted:
                assert not stored
            else:
                assert stored == [f"{doc_id} at revision {newest}"]

"""Milvus Lite's flush gap and the gate that closes it (deployments/vector_store/lite_server.py),
on a real Milvus Lite server in a thread of this process.

A flush swaps in a fresh MemTable before it takes the collection's lock, and a read takes its
snapshot of the segments under that lock but reads the MemTable after: a read whose snapshot
was taken before the swap and whose MemTable read comes after it sees the frozen rows nowhere.
Here the read is held between the two (its snapshot taken, it waits for the swap, at most a
second) while another client flushes. Without the gate it misses writes acknowledged before
it began: an updated row comes back in its previous state, a new row not at all. With it the
flush waits for the read, which sees both. The first test fails once Milvus Lite closes the gap
itself (then the gate can go)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("milvus_lite")

from milvus_lite.adapter.grpc.server import start_server_in_thread  # noqa: E402
from milvus_lite.engine import collection as lite_collection_module  # noqa: E402
from pymilvus import DataType, MilvusClient  # noqa: E402

from deployments.vector_store import lite_server  # noqa: E402

HOLD_S = 1.0  # how long the held read waits for the swap at most


class Gap:
    """Holds the next read of the armed collection between its snapshot and its MemTable
    read until a flush has swapped the MemTable (or ``HOLD_S`` passed)."""

    def __init__(self) -> None:
        self.collection = ""
        self.snapshot_taken = threading.Event()
        self.swapped = threading.Event()


@pytest.fixture
def server(tmp_path, monkeypatch):
    gap = Gap()
    cls = lite_server.lite_collection()
    real_snapshot = cls._read_snapshot
    real_flush = lite_collection_module.execute_flush

    def held_snapshot(self):
        snapshot = real_snapshot(self)
        if gap.collection and self.name == gap.collection:
            gap.collection = ""
            gap.snapshot_taken.set()
            gap.swapped.wait(HOLD_S)
        return snapshot

    def flush_after_the_swap(*args, **kwargs):
        gap.swapped.set()
        return real_flush(*args, **kwargs)

    monkeypatch.setattr(cls, "_read_snapshot", held_snapshot)
    monkeypatch.setattr(lite_collection_module, "execute_flush", flush_after_the_swap)
    grpc_server, db, port = start_server_in_thread(str(tmp_path / "lite"), port=0)
    yield MilvusClient(uri=f"http://127.0.0.1:{port}"), gap
    grpc_server.stop(grace=1)
    db.close()


def make_collection(client: MilvusClient) -> str:
    name = f"gap_{uuid.uuid4().hex[:8]}"
    schema = MilvusClient.create_schema(auto_id=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("acl", DataType.VARCHAR, max_length=64)
    schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)
    index = MilvusClient.prepare_index_params()
    index.add_index("v", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index)
    client.upsert(name, [{"id": "doc", "acl": "everyone", "v": [0.0, 0.0]}])
    client.flush(name)  # the open state is in a segment
    return name


def read_during_a_flush(client: MilvusClient, gap: Gap) -> dict[str, str]:
    """Tighten ``doc`` and add ``new`` (both acknowledged), then read both while another
    client flushes."""
    name = make_collection(client)
    client.upsert(name, [{"id": "doc", "acl": "hr", "v": [0.0, 0.0]}])
    client.upsert(name, [{"id": "new", "acl": "hr", "v": [0.0, 0.0]}])
    gap.swapped.clear()
    gap.snapshot_taken.clear()
    gap.collection = name
    rows: list[dict] = []
    reader = threading.Thread(
        target=lambda: rows.extend(client.get(name, ids=["doc", "new"], output_fields=["acl"]))
    )
    reader.start()
    assert gap.snapshot_taken.wait(10)
    flusher = threading.Thread(target=client.flush, args=(name,))
    flusher.start()
    reader.join(10)
    flusher.join(10)
    return {r["id"]: r["acl"] for r in rows}


def test_without_the_gate_a_read_during_a_flush_misses_acknowledged_writes(server):
    client, gap = server
    assert read_during_a_flush(client, gap) == {"doc": "everyone"}  # revoked back, new gone


def test_with_the_gate_the_flush_waits_for_the_read_and_it_sees_them(server, monkeypatch):
    client, gap = server
    cls = lite_server.lite_collection()
    for name, value in lite_server.gated(cls).items():
        monkeypatch.setattr(cls, name, value, raising=False)
    started = time.monotonic()
    assert read_during_a_flush(client, gap) == {"doc": "hr", "new": "hr"}
    assert not gap.swapped.is_set() or time.monotonic() - started >= HOLD_S


def test_the_gate_lets_reads_share_and_a_flush_wait_for_them():
    gate = lite_server.FlushGate()
    gate.acquire_read()
    gate.acquire_read()  # a second reader (or a read inside a read) does not wait
    flushed = threading.Event()

    def flush() -> None:
        gate.acquire_flush()
        flushed.set()
        gate.release_flush()

    thread = threading.Thread(target=flush)
    thread.start()
    assert not flushed.wait(0.2)
    gate.acquire_read()  # a flush that only waits holds no reader back
    gate.release_read()
    gate.release_read()
    assert not flushed.wait(0.1)
    gate.release_read()
    assert flushed.wait(2)
    thread.join()


def test_another_milvus_lite_without_the_methods_is_refused():
    class Other:
        def get(self):  # no _trigger_flush, no query, ...
            return None

    with pytest.raises(RuntimeError, match="_trigger_flush"):
        lite_server.gated(Other)

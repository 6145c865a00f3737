"""HandleProxy: a Serve handle behaves like a backend protocol, errors mapped on the way."""

from __future__ import annotations

import pytest
from ray.exceptions import RayTaskError

from deployments.errors import BackendUnavailable, Forbidden, InvalidInput
from serve_app.handles import HandleProxy


class FakeMethod:
    def __init__(self, outcome):
        self.outcome = outcome
        self.calls: list[tuple[tuple, dict]] = []

    def remote(self, *args, **kwargs):
        self.calls.append((args, kwargs))

        async def respond():
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

        return respond()


class FakeHandle:
    def __init__(self, **methods: FakeMethod) -> None:
        for name, method in methods.items():
            setattr(self, name, method)


async def test_method_call_is_forwarded_with_its_arguments():
    method = FakeMethod([1, 2])
    proxy = HandleProxy(FakeHandle(count=method), "milvus")
    assert await proxy.count("dao_x", extra=True) == [1, 2]
    assert method.calls == [(("dao_x",), {"extra": True})]


@pytest.mark.parametrize(
    "error", [InvalidInput("bad"), Forbidden("no"), BackendUnavailable("x", "y")]
)
async def test_gateway_errors_reach_the_caller_as_themselves(error):
    proxy = HandleProxy(FakeHandle(search=FakeMethod(error)), "milvus")
    with pytest.raises(type(error)) as info:
        await proxy.search()
    assert info.value is error


async def test_gateway_error_wrapped_in_ray_task_error_is_unwrapped():
    cause = InvalidInput("dimension mismatch")
    wrapped = RayTaskError("upsert", "traceback text", cause)
    proxy = HandleProxy(FakeHandle(upsert=FakeMethod(wrapped)), "milvus")
    with pytest.raises(InvalidInput) as info:
        await proxy.upsert([])
    assert info.value is cause


async def test_unexpected_replica_crash_becomes_backend_unavailable_naming_the_backend():
    wrapped = RayTaskError("embed", "traceback text", RuntimeError("CUDA error"))
    proxy = HandleProxy(FakeHandle(embed=FakeMethod(wrapped)), "embedder")
    with pytest.raises(BackendUnavailable, match="embedder") as info:
        await proxy.embed(["x"])
    assert info.value.backend == "embedder"


async def test_any_other_exception_becomes_backend_unavailable():
    proxy = HandleProxy(FakeHandle(status=FakeMethod(ConnectionError("gone"))), "neo4j")
    with pytest.raises(BackendUnavailable, match="ConnectionError: gone") as info:
        await proxy.status()
    assert info.value.status_code == 503


def test_private_attributes_are_not_proxied():
    proxy = HandleProxy(FakeHandle(), "milvus")
    with pytest.raises(AttributeError):
        proxy._secret  # noqa: B018


async def test_a_replica_failure_reaches_the_caller_as_one_short_line():
    # What Ray gives for an exception it could not pickle: a traceback with ANSI colours,
    # internal paths and PIDs, then the message.
    text = (
        "\x1b[36mray::ServeReplica:rag:Retriever.handle_request()\x1b[39m (pid=4242, ip=10.0.0.1)\n"
        'Traceback (most recent call last):\n  File "/opt/ray/serve/_private/replica.py", line 1\n'
        "    raise\nMilvusException: <MilvusException: (code=2, message=Fail connecting to server)>"
        + " detail"
        * 200
    )
    proxy = HandleProxy(FakeHandle(search=FakeMethod(RuntimeError(text))), "milvus")
    with pytest.raises(BackendUnavailable) as err:
        await proxy.search()
    message = err.value.message
    assert "\x1b" not in message and "\n" not in message and "pid=" not in message
    assert "Traceback" not in message and "/opt/ray" not in message
    assert "MilvusException" in message and len(message) <= 320


async def test_the_retrievers_candidates_travel_packed_and_arrive_as_hits():
    """StoreProxy calls ``candidates_packed`` (one standard pickle, what
    RetrieverDeployment returns) and hands the caller the candidates themselves; an error
    of the replica is mapped as for any call."""
    import pickle

    from deployments.protocols import ChunkRecord, SearchFilter, SearchHit
    from deployments.vector_store.deployment import RetrieverDeployment
    from serve_app.handles import StoreProxy

    chunk = ChunkRecord("c1", "d1", "t1", 0, "text", "title", "h", "m", tags=("a",))
    found = {"dense": [SearchHit(chunk, 0.9, {"dense": 0.9})], "bm25": []}

    class Shell(RetrieverDeployment):
        def __init__(self) -> None:  # no store: only candidates_packed is under test
            pass

        async def candidates(self, *args, **kwargs):
            self.args = (args, kwargs)
            return found

    shell = Shell()
    packed = await shell.candidates_packed("q", [0.1], SearchFilter(team_id="t1"), 5, ("dense",))
    assert isinstance(packed, bytes) and pickle.loads(packed) == found
    method = FakeMethod(packed)
    proxy = StoreProxy(FakeHandle(candidates_packed=method), "milvus")
    flt = SearchFilter(team_id="t1")
    assert await proxy.candidates("q", [0.1], flt, 5, ("dense",), "r1") == found
    assert method.calls == [(("q", [0.1], flt, 5, ("dense",), "r1"), {})]
    failing = StoreProxy(FakeHandle(candidates_packed=FakeMethod(RuntimeError("died"))), "milvus")
    with pytest.raises(BackendUnavailable):
        await failing.candidates("q", None, flt, 5, ("bm25",))

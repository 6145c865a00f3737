"""Helpers shared by the benchmarks: logging, statistics, progress lines, result files."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_PORT = 8300

logger = logging.getLogger("bench")


def setup_logging(verbose: bool = False) -> None:
    """Timestamped log lines on stderr; Ray's own loggers stay at WARNING."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("ray", "ray.serve", "httpx", "httpcore", "neo4j", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # pymilvus logs every failed reconnect with a traceback; the harness retries and reports.
    logging.getLogger("pymilvus").setLevel(logging.ERROR)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (``p`` in 0–100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return float(data[lo] + (data[hi] - data[lo]) * (rank - lo))


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean/min/max in milliseconds of a list of durations in seconds."""
    ms = [s * 1000.0 for s in seconds]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p95_ms": round(percentile(ms, 95), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


def rate_summary(rates: Sequence[float]) -> dict[str, Any]:
    """Median/min/max of repeated throughput measurements (higher is better)."""
    return {
        "reps": [round(r, 2) for r in rates],
        "median": round(statistics.median(rates), 2) if rates else math.nan,
        "min": round(min(rates), 2) if rates else math.nan,
        "max": round(max(rates), 2) if rates else math.nan,
    }


class Progress:
    """Logs ``done/total``, the rate since the start and an ETA at most every ``every_s``."""

    def __init__(self, what: str, total: int, unit: str, every_s: float = 5.0) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.every_s = every_s
        self.done = 0
        self.started = time.perf_counter()
        self._last_log = self.started

    def add(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self._last_log >= self.every_s or self.done >= self.total:
            self._last_log = now
            self.log()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    def log(self) -> None:
        rate = self.rate
        left = max(self.total - self.done, 0)
        eta = left / rate if rate > 0 else math.inf
        logger.info(
            "%s: %d/%d %s (%.0f%%), %.1f %s/s, elapsed %s, ETA %s",
            self.what,
            self.done,
            self.total,
            self.unit,
            100.0 * self.done / max(self.total, 1),
            rate,
            self.unit,
            fmt_duration(self.elapsed),
            fmt_duration(eta),
        )


def fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
        return str(value)

    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# The instruction sets a model's kernels choose between: an int8 query embedding costs 1.3 ms
# with AVX-512 VNNI and ~7 ms with AVX2 alone (bench/README.md, "Two CPUs").
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name and which of ``CPU_FLAGS`` it has (Linux's /proc/cpuinfo): the
    same benchmark runs several times faster on one VM than on another of the same size."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {"cpu_model": platform.processor() or None, "cpu_flags": None}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name") or platform.processor() or None,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
    }


def environment_info() -> dict[str, Any]:
    """What the numbers depend on: machine, load, versions, commit."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        **cpu_info(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        from importlib.metadata import version

        for pkg in (
            "ray",
            "torch",
            "transformers",
            "onnxruntime",
            "pymilvus",
            "milvus-lite",
            "neo4j",
        ):
            try:
                info[f"{pkg}_version"] = version(pkg)
            except Exception:
                info[f"{pkg}_version"] = None
    except ImportError:  # pragma: no cover
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
        info["git_commit"] = commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def write_result(name: str, payload: dict[str, Any], out: str | None = None) -> Path:
    """Write ``payload`` as JSON to ``out`` or ``bench/results/<name>-<UTC time>.json``."""
    if out:
        path = Path(out)
    else:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    logger.info("wrote %s", path)
    return path


def parse_int_list(value: str) -> list[int]:
    """``"1,8"`` → ``[1, 8]`` (argparse type)."""
    return [int(v) for v in value.split(",") if v.strip()]


async def closed_loop(
    items: Sequence[Any],
    concurrency: int,
    call: Callable[[Any], Awaitable[Any]],
) -> tuple[float, list[float], list[Any], list[BaseException]]:
    """Run ``call(item)`` for every item with ``concurrency`` workers, each sending its next
    request as soon as the previous one answered (closed loop).

    Returns:
        ``(wall_seconds, latencies_seconds, results, errors)``; failed calls give an error
        instead of a latency/result.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    latencies: list[float] = []
    results: list[Any] = []
    errors: list[BaseException] = []

    async def worker() -> None:
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            try:
                result = await call(item)
            except Exception as exc:
                errors.append(exc)
                continue
            latencies.append(time.perf_counter() - t0)
            results.append(result)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return time.perf_counter() - started, latencies, results, errors


async def http_ingest(
    base_url: str,
    docs: Sequence[dict[str, Any]],
    *,
    batch_size: int,
    concurrency: int,
    progress: Progress | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """POST ``docs`` to ``/ingest/documents`` in requests of ``batch_size`` documents with
    ``concurrency`` concurrent clients. Counts chunks from the responses."""
    import httpx

    batches = [list(docs[i : i + batch_size]) for i in range(0, len(docs), batch_size)]
    totals = {"indexed": 0, "unchanged": 0, "failed": 0, "chunks": 0, "degraded": 0}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:

        async def post(batch: list[dict[str, Any]]) -> dict[str, Any]:
            resp = await client.post("/ingest/documents", json={"documents": batch})
            if resp.status_code != 200:
                raise RuntimeError(f"ingest answered {resp.status_code}: {resp.text[:500]}")
            body = resp.json()
            for key in ("indexed", "unchanged", "failed"):
                totals[key] += int(body[key])
            chunks = sum(d["chunks"] for d in body["documents"] if d["status"] == "indexed")
            totals["chunks"] += chunks
            totals["degraded"] += bool(body.get("degraded"))
            if progress is not None:
                progress.add(len(batch))  # documents answered (a document may make several chunks)
            return body

        wall, latencies, _, errors = await closed_loop(batches, concurrency, post)
    for exc in errors[:3]:
        logger.error("ingest request failed: %s", exc)
    return {
        "wall_s": round(wall, 3),
        "requests": len(batches),
        "errors": len(errors),
        "chunks_per_s": round(totals["chunks"] / wall, 2) if wall > 0 else math.nan,
        "docs_per_s": round(totals["indexed"] / wall, 2) if wall > 0 else math.nan,
        "request_latency": latency_summary(latencies),
        **totals,
    }


def start_local_ray(tmp: Path, num_cpus: int | None) -> None:
    """A private local Ray for a benchmark: its files and a fresh auth token under ``tmp``
    (nothing in ~/.ray), loopback only."""
    import secrets

    token = tmp / "ray_token"
    token.write_text(secrets.token_hex(32))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    import ray

    ray.init(
        address="local",
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp / "ray"),
        num_cpus=num_cpus,
    )

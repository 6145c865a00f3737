"""Sampling profiles of the gateway's processes during one benchmark level (py-spy).

``SpyGroup(folder, label).start(pids)`` starts ``py-spy record --format raw`` on each
process (the Serve replicas: Ingress, Embedder, Retriever; the Python proxy when Serve runs
one), ``stop()`` ends them (SIGINT: py-spy writes its file) and ``summarize`` reads each file:
samples, the share of each *kind* of code at the leaf (the gateway's own, Ray Serve, gRPC,
HTTP server, numpy, the model runtime, pydantic, asyncio, …) and the top leaf functions.
py-spy is in the dev extras (``pip install -e .[dev]``)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

# Leaf frame's file → kind of code (first match wins).
KINDS = (
    ("(serve_app/", "gateway"),
    ("(deployments/", "gateway"),
    ("(batch_ingest/", "gateway"),
    ("(ray/serve/", "ray serve"),
    ("(ray/", "ray core"),
    ("_raylet", "ray core"),
    ("(grpc/", "grpc"),
    ("(uvicorn/", "http server"),
    ("(starlette/", "http server"),
    ("(fastapi/", "http server"),
    ("(h11/", "http server"),
    ("(httptools/", "http server"),
    ("(pydantic", "pydantic"),
    ("(numpy/", "numpy"),
    ("(onnxruntime/", "model runtime"),
    ("(torch/", "model runtime"),
    ("(tokenizers/", "model runtime"),
    ("(transformers/", "model runtime"),
    ("(pymilvus/", "milvus client"),
    ("(sqlalchemy/", "state db"),
    ("(sqlite3/", "state db"),
    ("(jwt/", "auth"),
    ("(asyncio/", "asyncio"),
    ("(concurrent/", "threads"),
    ("(threading.py", "threads"),
    ("(json/", "json"),
    ("(logging/", "logging"),
    ("(pickle", "pickle"),
    ("(copyreg", "pickle"),
    ("(dataclasses.py", "dataclasses"),
    ("(bm25s/", "bm25s"),
)


def py_spy() -> str | None:
    here = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class SpyGroup:
    """py-spy on several processes at once, one raw file each under ``folder``."""

    def __init__(self, folder: Path, label: str, rate: int = 100) -> None:
        self.folder = folder
        self.label = label
        self.rate = rate
        self._procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(self, pids: dict[str, int]) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy not found: pip install py-spy (the dev extras have it)")
        self.folder.mkdir(parents=True, exist_ok=True)
        for role, pid in pids.items():
            out = self.folder / f"spy-{self.label}-{role}.txt"
            cmd = [exe, "record", "--nonblocking", "--rate", str(self.rate), "--format", "raw"]
            cmd += ["-o", str(out), "--pid", str(pid)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._procs[role] = (proc, out)
        time.sleep(0.5)  # attached before the level starts

    def stop(self) -> dict[str, dict[str, Any]]:
        for proc, _ in self._procs.values():
            proc.send_signal(signal.SIGINT)
        out = {}
        for role, (proc, path) in self._procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if path.exists():
                out[role] = summarize(path)
        self._procs.clear()
        return out


def kind_of(frame: str) -> str:
    for needle, kind in KINDS:
        if needle in frame:
            return kind
    return "other"


def summarize(path: Path, top: int = 8) -> dict[str, Any]:
    """Samples, the share of each kind of code at the leaf, the top leaf functions, and the
    share of samples with the gateway's own code anywhere on the stack."""
    kinds: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    ours = 0
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        total += n
        kinds[kind_of(leaf)] += n
        leaves[leaf] += n
        ours += n * any(kind_of(f) == "gateway" for f in frames)
    if total == 0:
        return {"samples": 0}
    return {
        "samples": total,
        "kinds_pct": {k: round(100 * v / total, 1) for k, v in kinds.most_common()},
        "gateway_on_stack_pct": round(100 * ours / total, 1),
        "top_leaves_pct": {f: round(100 * v / total, 1) for f, v in leaves.most_common(top)},
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.profiles FILE...``: the summary of each raw py-spy file."""
    import json
    import sys

    for name in argv if argv is not None else sys.argv[1:]:
        print(name, json.dumps(summarize(Path(name), top=12), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A library's import-time ``logging.config.dictConfig`` must not silence a Serve replica's log
file: pymilvus makes one when it is first imported, which closed the ``MemoryHandler`` Serve
puts in front of ``logs/serve/replica_*.log`` (issue 32: Retriever replicas wrote their start
lines and then nothing, while stderr had every call).

The first two tests run in a fresh interpreter each (pymilvus must not be imported yet) with
the replica's logger set up by Serve's own ``configure_component_logger``, as a replica does.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Serve's replica logger (JSON, into a folder of the test's own), an access line, then `body`,
# (in place of BODY), then another access line; prints the messages the replica's log file holds.
SCRIPT = """
import json, logging, sys
from ray.serve._private.common import ServeComponentType
from ray.serve._private.logging_utils import configure_component_logger
from ray.serve.schema import LoggingConfig

logs = sys.argv[1]
configure_component_logger(
    component_name="rag_gateway_Retriever",
    component_id="r1",
    component_type=ServeComponentType.REPLICA,
    logging_config=LoggingConfig(encoding="JSON", logs_dir=logs),
    max_bytes=1 << 20,
    backup_count=1,
    buffer_size=1,
)
serve = logging.getLogger("ray.serve")
serve.info("CALL count OK 1.0ms", extra={"serve_access_log": True})
BODY
serve.info("CALL candidates OK 2.0ms", extra={"serve_access_log": True})
with open(f"{logs}/replica_rag_gateway_Retriever_r1.log") as f:
    print(json.dumps([json.loads(line)["message"] for line in f]))
"""


def replica_log_after(body: str, tmp_path: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("BODY", body), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_pymilvus_through_the_deployments_keeps_the_replica_log_file(tmp_path):
    body = (
        "import logging.config\n"
        "from deployments.vector_store.client import import_pymilvus\n"
        "assert 'pymilvus' not in sys.modules\n"
        "import_pymilvus()\n"
        "assert 'pymilvus' in sys.modules\n"
    )
    assert replica_log_after(body, tmp_path) == ["CALL count OK 1.0ms", "CALL candidates OK 2.0ms"]


def test_any_dict_config_inside_keep_log_handlers_leaves_the_replica_log_file_open(tmp_path):
    body = (
        "import logging.config\n"
        "from deployments.tracing import keep_log_handlers\n"
        "with keep_log_handlers():\n"
        "    logging.config.dictConfig({'version': 1, 'disable_existing_loggers': False,\n"
        "        'loggers': {'some_library': {'level': 'WARNING'}}})\n"
    )
    assert replica_log_after(body, tmp_path) == ["CALL count OK 1.0ms", "CALL candidates OK 2.0ms"]


def test_the_same_dict_config_outside_it_closes_the_file_which_is_what_went_wrong(tmp_path):
    # The cause, shown: without the guard the second access line never reaches the file.
    body = (
        "import logging.config\n"
        "logging.config.dictConfig({'version': 1, 'disable_existing_loggers': False,\n"
        "    'loggers': {'some_library': {'level': 'WARNING'}}})\n"
    )
    assert replica_log_after(body, tmp_path) == ["CALL count OK 1.0ms"]


def _pymilvus_imports(tree: ast.AST) -> list[int]:
    """Line numbers of ``import pymilvus…`` / ``from pymilvus… import`` under ``tree``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(name.split(".")[0] == "pymilvus" for name in names):
            lines.append(node.lineno)
    return lines


def _import_pymilvus_calls(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "import_pymilvus"
    ]


def test_every_pymilvus_import_of_the_gateway_goes_through_import_pymilvus():
    """A new ``from pymilvus import`` that could be a process's first would silence the
    replica's log file again: each must follow ``import_pymilvus()`` in its function."""
    offenders = []
    for package in ("deployments", "batch_ingest", "serve_app"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for func in ast.walk(tree):
                if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                if func.name == "import_pymilvus":
                    continue
                guards = _import_pymilvus_calls(func)
                offenders += [
                    f"{path.relative_to(ROOT)}:{line}"
                    for line in _pymilvus_imports(func)
                    if not any(g < line for g in guards)
                ]
            # A module-level import runs whenever its module is first imported, which may be
            # in a replica after Serve set its logger up (and it would load pymilvus into the
            # ingress, which never needs it): none may exist.
            offenders += [
                f"{path.relative_to(ROOT)}:{line} (module level)"
                for stmt in tree.body
                for line in _pymilvus_imports(stmt)
                if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            ]
    assert offenders == []

"""The private Ray of a reindex driver (``batch_ingest.reindex.private_ray``): its session
files and auth token stay in the repository's ``var/ray/``, never in ``~/.ray`` (issue 33).
``ray.init`` is replaced by a recorder: no Ray starts."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from batch_ingest.reindex import private_ray


@pytest.fixture
def fake_ray_init(monkeypatch, tmp_path):
    import ray

    calls: list[dict[str, Any]] = []
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in (
        "RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    ):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores what init_ray sets
        monkeypatch.delenv(name)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append({**kw, "env": dict(os.environ)}))
    return calls


def test_a_private_ray_keeps_its_files_and_token_in_var_ray(
    fake_ray_init, monkeypatch, tmp_path, request
):
    var = Path(tempfile.mkdtemp(prefix="rv"))  # short: Ray's socket paths must fit
    request.addfinalizer(lambda: shutil.rmtree(var, ignore_errors=True))
    monkeypatch.setenv("RAG_VAR_DIR", str(var))
    private_ray.init_ray(num_cpus=2)
    [call] = fake_ray_init
    assert call["address"] == "local" and call["num_cpus"] == 2
    assert call["_temp_dir"] == str(var / "ray" / "tmp")
    assert call["include_dashboard"] is False and call["log_to_driver"] is False
    token = var / "ray" / "auth_token"
    assert call["env"]["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert "RAY_AUTH_MODE" not in call["env"]  # Ray's default (token) reads it at import
    assert len(token.read_text()) == 64 and stat.S_IMODE(token.stat().st_mode) == 0o600
    assert not (tmp_path / "home" / ".ray").exists()
    first = token.read_text()
    private_ray.init_ray()
    assert token.read_text() == first  # made once


def test_a_long_repository_path_gets_a_short_ray_temp_dir(fake_ray_init, monkeypatch, tmp_path):
    var = tmp_path / ("x" * 80)
    monkeypatch.setenv("RAG_VAR_DIR", str(var))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "systmp"))
    private_ray.init_ray()
    [call] = fake_ray_init
    assert call["_temp_dir"] == str(tmp_path / "systmp" / f"rag-ray-{os.getuid()}")
    assert call["env"]["RAY_AUTH_TOKEN_PATH"] == str(var / "ray" / "auth_token")


def test_a_token_given_in_the_environment_is_used_as_it_is(fake_ray_init, monkeypatch):
    var = Path(tempfile.mkdtemp(prefix="rv"))
    monkeypatch.setenv("RAG_VAR_DIR", str(var))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a" * 64)
    private_ray.init_ray()
    assert "RAY_AUTH_TOKEN_PATH" not in fake_ray_init[0]["env"]
    assert not (var / "ray" / "auth_token").exists()
    shutil.rmtree(var, ignore_errors=True)


def test_ray_address_joins_that_cluster_without_a_private_instance(fake_ray_init, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    private_ray.init_ray()
    [call] = fake_ray_init
    assert call["address"] == "ray://head:10001" and "_temp_dir" not in call
    assert "RAY_AUTH_TOKEN_PATH" not in call["env"]

"""deploy/k8s/rayservice.yaml: generated from serve_config.yaml (never stale), a RayService
whose serveConfigV2 Ray's own schema and our app builder accept, with the proxy on 0.0.0.0,
production settings and secrets by reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_render():
    spec = importlib.util.spec_from_file_location("render", ROOT / "deploy/k8s/render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_manifest_is_generated_from_serve_config():
    assert load_render().main(["--check"]) == 0


def test_serve_config_v2_is_valid_for_ray_and_the_app(clean_gateway_env, monkeypatch):
    from ray.serve.schema import ServeDeploySchema

    from serve_app.app import AppArgs

    manifest = yaml.safe_load((ROOT / "deploy/k8s/rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService" and manifest["apiVersion"] == "ray.io/v1"
    serve = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    assert serve.http_options.host == "0.0.0.0"
    (app,) = serve.applications
    args = AppArgs.model_validate(app.args)
    assert args.settings["environment"] == "production"
    # Production settings need a verified identity: the pods' environment provides it.
    monkeypatch.setenv("AUTH__MODE", "jwt")
    monkeypatch.setenv("AUTH__HS256_SECRET", "k8s-test-secret-0123456789abcdef0123456789")
    monkeypatch.setenv("AUTH__ISSUER", "https://idp.example")
    monkeypatch.setenv("AUTH__AUDIENCE", "rag-gateway")
    monkeypatch.setenv("NEO4J__PASSWORD", "not-the-dev-password")
    args.gateway_settings()
    spec = manifest["spec"]["rayClusterConfig"]
    env = {e["name"]: e for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert "secretKeyRef" in env["NEO4J__PASSWORD"]["valueFrom"]
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpu["nvidia.com/gpu"] == "1"

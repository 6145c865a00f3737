"""serve_config.yaml and cluster.yaml are accepted by Ray's own schemas and our builder."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_matches_ray_schema_and_app_args():
    from ray.serve.schema import ServeDeploySchema

    from serve_app.app import AppArgs, build_app

    raw = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw)
    (app,) = schema.applications
    assert app.import_path == "serve_app.app:build_app"
    assert schema.http_options.host == "127.0.0.1"
    args = AppArgs.model_validate(app.args)
    args.gateway_settings()
    build_app(args)
    names = {d["name"] for d in raw["applications"][0]["deployments"]}
    assert names == {"Ingress", "Embedder", "Retriever", "Graph"}


def test_cluster_yaml_passes_ray_autoscaler_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load((ROOT / "cluster.yaml").read_text())))

"""deploy/k8s/rayservice.yaml: generated from serve_config.yaml (never stale), a RayService
whose serveConfigV2 Ray's own schema and our app builder accept, with the proxy on 0.0.0.0,
production settings and secrets by reference; and every manifest of deploy/k8s valid against
the Kubernetes schemas (the RayService against KubeRay's CRD schema), offline, and consistent
with the others and with what the gateway expects (secrets, services, settings)."""

from __future__ import annotations

import copy
import functools
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
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


# --- The other manifests: Kubernetes schemas, the RayService CRD, consistency -------------
#
# Offline only: kubernetes-validate ships the Kubernetes JSON schemas, the RayService CRD
# schema is in deploy/k8s/schemas/ (KubeRay v1.7.0); nothing here needs a cluster or Helm.

K8S = ROOT / "deploy/k8s"
KUBERNETES_VERSIONS = ("1.30", "1.37")
CRD_SCHEMA = K8S / "schemas/rayservice-v1.schema.yaml"
SECRET_TEMPLATE = K8S / "secrets.example.yaml"
MILVUS_VALUES = K8S / "milvus-values.yaml"
# The backend URLs of the gateway's and the consumer's environment.
BACKEND_URLS = (
    "MILVUS__URI",
    "NEO4J__URI",
    "STATE__URL",
    "AUDIT__URL",
    "CACHE__REDIS_URL",
    "NATS__URL",
)
# What the consumer and the gateway must agree on for the vectors it writes to be searchable.
EMBEDDING_FIELDS = (
    "backend",
    "quantize",
    "embed_model_tag",
    "model_path",
    "model_name",
    "model_version",
    "dim",
    "pooling",
    "normalize",
    "max_length",
    "query_prefix",
    "passage_prefix",
)
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    **{s: 1024**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _load_all(path: Path) -> tuple[dict[str, Any], ...]:
    """A file's documents, parsed once: callers copy before they change one."""
    return tuple(doc for doc in yaml.load_all(path.read_text(), Loader=_LOADER) if doc)


def manifest_files() -> list[Path]:
    """Every manifest of deploy/k8s; ``*-values.yaml`` are Helm values, not manifests."""
    return sorted(p for p in K8S.glob("*.yaml") if not p.name.endswith("-values.yaml"))


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, doc) for p in manifest_files() for doc in _load_all(p)]


def _label(name: str, doc: dict[str, Any]) -> str:
    return f"{name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """(where, PodTemplateSpec) of every workload, the RayService's groups included."""
    found = []
    for name, doc in documents():
        if doc["kind"] in WORKLOADS:
            found.append((_label(name, doc), doc["spec"]["template"]))
        elif doc["kind"] == "RayService":
            cluster = doc["spec"]["rayClusterConfig"]
            found.append((f"{_label(name, doc)} head", cluster["headGroupSpec"]["template"]))
            for group in cluster["workerGroupSpecs"]:
                found.append((f"{_label(name, doc)} {group['groupName']}", group["template"]))
    return found


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _quantity(value: Any) -> float:
    match = _QUANTITY.match(str(value))
    assert match, f"{value!r} is not a Kubernetes quantity"
    return float(match.group(1)) * _FACTORS[match.group(2)]


def _k8s_errors(doc: dict[str, Any], version: str) -> list[str]:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def _pod_template_errors(template: dict[str, Any], version: str) -> list[str]:
    """A PodTemplateSpec checked as the core/v1 PodTemplate object that wraps one."""
    wrapped = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "template"},
        "template": template,
    }
    return _k8s_errors(wrapped, version)


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused (the API server prunes or, with
    --validate=strict, rejects them): additionalProperties false wherever properties are
    listed and unknown fields are not explicitly kept."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_validator() -> Any:
    import jsonschema

    schema = yaml.load(CRD_SCHEMA.read_text(), Loader=_LOADER)
    # OpenAPI 3.0 schemas (CRDs) follow JSON Schema draft 4 semantics.
    return jsonschema.Draft4Validator(_strict(schema))


def _crd_errors(doc: dict[str, Any]) -> list[str]:
    errors = sorted(_crd_validator().iter_errors(doc), key=lambda e: list(map(str, e.path)))
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]


def _readme_services() -> set[tuple[str, int]]:
    """The ``name:port`` pairs of the README's "What the gateway expects" section."""
    text = (K8S / "README.md").read_text()
    section = text.split("## What the gateway expects", 1)[1].split("\n## ", 1)[0]
    return {(n, int(p)) for n, p in re.findall(r"`([a-z][a-z0-9-]*):(\d+)`", section)}


def _provided_services() -> set[tuple[str, int]]:
    """(Service name, port) of the manifests, and Milvus's from the chart's values."""
    provided = {
        (doc["metadata"]["name"], port["port"])
        for _, doc in documents()
        if doc["kind"] == "Service"
        for port in doc["spec"]["ports"]
    }
    values = yaml.safe_load(MILVUS_VALUES.read_text())
    provided.add((values["fullnameOverride"], values["service"]["port"]))
    return provided


def _rayservice() -> dict[str, Any]:
    (manifest,) = _load_all(K8S / "rayservice.yaml")
    return manifest


def _consumer_container() -> dict[str, Any]:
    (container,) = _one("Deployment", "rag-ingest-consumer")["spec"]["template"]["spec"][
        "containers"
    ]
    return container


def _set_env(monkeypatch, container: dict[str, Any]) -> None:
    """A container's environment in this process; a secret as ``test-<key>``."""
    for item in container.get("env", []):
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
        else:
            key = item["valueFrom"]["secretKeyRef"]["key"]
            monkeypatch.setenv(item["name"], f"test-{key.lower()}-0123456789")


def test_the_manifests_are_there():
    names = {p.name for p in manifest_files()}
    assert {"rayservice.yaml", "backends.yaml", "consumer.yaml", "secrets.example.yaml"} <= names
    for name, doc in documents():
        assert doc.get("apiVersion") and doc.get("kind"), name
        assert doc["metadata"].get("namespace") == "rag", _label(name, doc)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_matches_the_kubernetes_schemas(version):
    errors = []
    for name, doc in documents():
        if doc["kind"] != "RayService":
            errors += [f"{_label(name, doc)}: {e}" for e in _k8s_errors(doc, version)]
    # The RayService's pod templates too (the workloads' are part of their documents).
    for where, template in pod_templates():
        if "RayService" in where:
            errors += [f"{where}: {e}" for e in _pod_template_errors(template, version)]
    assert not errors, "\n".join(errors)


def test_rayservice_matches_the_kuberay_crd_schema():
    manifest = _rayservice()
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    assert not _crd_errors(manifest), "\n".join(_crd_errors(manifest))


def test_the_validators_refuse_a_broken_manifest():
    """Both checks above would fail on a typo or a wrong type (they are not vacuous)."""
    version = KUBERNETES_VERSIONS[0]
    statefulset = copy.deepcopy(_one("StatefulSet", "postgres"))
    statefulset["spec"]["replicas"] = "one"
    assert _k8s_errors(statefulset, version)
    statefulset = copy.deepcopy(_one("StatefulSet", "postgres"))
    statefulset["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert _k8s_errors(statefulset, version)
    assert _k8s_errors({**_one("Service", "redis"), "apiVersion": "v9"}, version)

    manifest = _rayservice()
    broken = copy.deepcopy(manifest)
    broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "four"
    assert _crd_errors(broken)
    broken = copy.deepcopy(manifest)
    broken["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    assert _crd_errors(broken)
    broken = copy.deepcopy(manifest)
    del broken["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert _crd_errors(broken)
    template = copy.deepcopy(manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = "gcs"
    assert _pod_template_errors(template, version)


def test_the_vendored_crd_schema_names_its_source_and_license():
    header = CRD_SCHEMA.read_text().split("\nproperties:", 1)[0]
    assert "https://github.com/ray-project/kuberay/blob/v1.7.0/" in header
    assert "ray.io_rayservices.yaml" in header
    assert "License: Apache-2.0" in header
    assert "KubeRay v1.7.0" in (K8S / "README.md").read_text()


def test_every_secret_reference_names_a_key_of_the_secret_template():
    (secret,) = _load_all(SECRET_TEMPLATE)
    assert secret["kind"] == "Secret"
    keys = set(secret["stringData"])
    referenced = set()
    for name, doc in documents():
        if doc["kind"] == "Secret":
            continue
        for node in _walk(doc):
            ref = node.get("secretKeyRef") or node.get("secretRef")
            if isinstance(node.get("secret"), dict):
                ref = {"name": node["secret"]["secretName"]}
                for item in node["secret"].get("items", []):  # files of a mounted Secret
                    assert item["key"] in keys, f"{_label(name, doc)}: no key {item['key']}"
                    referenced.add(item["key"])
            if ref is None:
                continue
            assert ref["name"] == secret["metadata"]["name"], _label(name, doc)
            if "key" in ref:
                assert ref["key"] in keys, f"{_label(name, doc)}: no key {ref['key']}"
                referenced.add(ref["key"])
    assert referenced == keys, f"keys nothing reads: {keys - referenced}"


def test_the_secret_template_and_the_values_hold_only_placeholders():
    (secret,) = _load_all(SECRET_TEMPLATE)
    assert "data" not in secret
    for key, value in secret["stringData"].items():
        assert "CHANGE-ME" in value, key
    minio = yaml.safe_load(MILVUS_VALUES.read_text())["minio"]
    assert "CHANGE-ME" in minio["accessKey"] and "CHANGE-ME" in minio["secretKey"]


def test_services_and_ports_are_the_ones_the_readme_names():
    expected = _readme_services()
    assert {name for name, _ in expected} == {"milvus", "neo4j", "postgres", "redis", "nats"}
    missing = expected - _provided_services()
    assert not missing, f"README names {missing}, no manifest provides them"
    gateway = [c for where, t in pod_templates() if "RayService" in where for c in _containers(t)]
    seen = set()
    for container in [*gateway, _consumer_container()]:
        for name, item in _env(container).items():
            if name not in BACKEND_URLS:
                continue
            url = urlsplit(item["value"])
            assert url.hostname and url.port, f"{name}={item['value']}: no host and port"
            host = url.hostname.split(".")
            assert len(host) == 1 or host[1] == "rag", f"{name}: not in namespace rag"
            assert (host[0], url.port) in expected, f"{name}={item['value']}"
            seen.add(name)
    assert seen == set(BACKEND_URLS)


def test_service_selectors_and_target_ports_match_their_pods():
    workloads = [(n, d) for n, d in documents() if d["kind"] in WORKLOADS]
    for name, doc in workloads:
        labels = doc["spec"]["template"]["metadata"]["labels"]
        selector = doc["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), _label(name, doc)
    for name, service in [(n, d) for n, d in documents() if d["kind"] == "Service"]:
        selector = service["spec"]["selector"]
        pods = [
            d["spec"]["template"]
            for _, d in workloads
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(pods) == 1, f"{_label(name, service)} selects {len(pods)} workloads"
        ports = [p for c in _containers(pods[0]) for p in c.get("ports", [])]
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            key = "name" if isinstance(target, str) else "containerPort"
            assert any(p.get(key) == target for p in ports), f"{_label(name, service)} {target}"
    for name, doc in workloads:
        if doc["kind"] != "StatefulSet":
            continue
        headless = _one("Service", doc["spec"]["serviceName"])
        assert headless["spec"].get("clusterIP") == "None", _label(name, doc)
        selector = doc["spec"]["selector"]["matchLabels"]
        assert headless["spec"]["selector"].items() <= selector.items(), _label(name, doc)


def test_every_container_has_requests_and_limits():
    for where, template in pod_templates():
        for container in _containers(template):
            resources = container.get("resources", {})
            for resource in ("cpu", "memory"):
                request = resources.get("requests", {}).get(resource)
                limit = resources.get("limits", {}).get(resource)
                assert request and limit, f"{where} {container['name']}: no {resource} bounds"
                assert _quantity(request) <= _quantity(limit), f"{where} {container['name']}"
    values = yaml.safe_load(MILVUS_VALUES.read_text())
    components = ("proxy", "mixCoordinator", "queryNode", "dataNode", "streamingNode")
    for component in (*components, "etcd", "minio"):
        resources = values[component]["resources"]
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[bound]), f"milvus {component} {bound}"
        for resource in ("cpu", "memory"):
            assert _quantity(resources["requests"][resource]) <= _quantity(
                resources["limits"][resource]
            )


def test_milvus_values_are_cluster_mode_with_its_own_etcd_minio_and_woodpecker():
    values = yaml.safe_load(MILVUS_VALUES.read_text())
    assert values["cluster"]["enabled"] is True
    assert values["etcd"]["enabled"] is True and values["etcd"]["replicaCount"] >= 3
    assert values["minio"]["enabled"] is True and values["minio"]["mode"] == "distributed"
    # Woodpecker as the write-ahead log, inside the streaming nodes, kept in that MinIO.
    assert values["woodpecker"]["enabled"] is True
    assert values["streaming"] == {
        "enabled": True,
        "woodpecker": {"embedded": True, "storage": {"type": "minio"}},
    }
    assert not any(values[mq]["enabled"] for mq in ("pulsarv3", "pulsar", "kafka"))
    assert values["indexNode"]["enabled"] is False  # no index node since Milvus 2.6
    config = yaml.safe_load(values["extraConfigFiles"]["user.yaml"])
    assert config["common"]["security"]["authorizationEnabled"] is True
    # The README's install command is for the chart version the file was written for.
    head = MILVUS_VALUES.read_text().split("\n\n", 1)[0]
    version = re.search(r"chart version (\S+) \(Milvus (v\S+)\)", head.replace("\n# ", " "))
    assert version and values["image"]["all"]["tag"] == version.group(2)
    readme = (K8S / "README.md").read_text()
    assert f"helm install milvus zilliztech/milvus --version {version.group(1)}" in readme


def test_the_consumer_runs_the_bus_consumer_with_the_gateways_image_and_settings(
    clean_gateway_env, monkeypatch
):
    import batch_ingest.consumer as consumer
    from serve_app.app import AppArgs

    manifest = _rayservice()
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    container = _consumer_container()
    assert container["image"] == head["containers"][0]["image"]
    assert container["command"] == ["python", "-m", "batch_ingest.consumer"]

    # The gateway's settings, from its pods' environment and its app args.
    _set_env(monkeypatch, head["containers"][0])
    monkeypatch.setenv("AUTH__HS256_SECRET", "k8s-test-secret-0123456789abcdef0123456789")
    monkeypatch.setenv("AUTH__ISSUER", "https://idp.example")
    monkeypatch.setenv("AUTH__AUDIENCE", "rag-gateway")
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    gateway = AppArgs.model_validate(app["args"]).gateway_settings()
    for item in head["containers"][0]["env"]:
        monkeypatch.delenv(item["name"])

    # The consumer's, through its own command line (nothing is started).
    _set_env(monkeypatch, container)
    seen = {}

    async def serve(cfg, settings, audit):
        seen.update(cfg=cfg, settings=settings, audit=audit)

    monkeypatch.setattr(consumer, "build_pipeline", lambda settings: settings)
    monkeypatch.setattr(consumer, "serve", serve)
    monkeypatch.setattr(consumer, "configure_logging", lambda *a, **k: None)
    assert consumer.main(container["args"]) == 0
    cfg, settings = seen["cfg"], seen["settings"]
    assert cfg.url == "nats://nats.rag.svc.cluster.local:4222"
    assert (cfg.stream, cfg.durable) == ("RAG_EVENTS", "rag-ingest")
    assert cfg.backoff_s[: cfg.max_deliver - 1] == cfg.backoff_s  # fewer steps than deliveries
    assert settings.environment == gateway.environment == "production"
    for section in ("milvus", "neo4j", "state", "chunking", "audit"):
        assert getattr(settings, section) == getattr(gateway, section), section
    # Every bus write is recorded in the gateway's audit log.
    assert seen["audit"] == gateway.audit and gateway.audit.url.startswith("postgresql")
    for name in EMBEDDING_FIELDS:
        assert getattr(settings.embedder, name) == getattr(gateway.embedder, name), name


def test_no_pod_gets_service_links():
    """Kubernetes would put NEO4J_PORT etc. into the pods; Neo4j reads every NEO4J_*."""
    for where, template in pod_templates():
        if "RayService" not in where:
            assert template["spec"].get("enableServiceLinks") is False, where


def test_neo4j_takes_the_gateways_user_and_password_and_a_fixed_memory():
    statefulset = _one("StatefulSet", "neo4j")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("neo4j:5.26")
    env = container["env"]
    names = [e["name"] for e in env]
    auth = _env(container)["NEO4J_AUTH"]["value"]
    user, _, password = auth.partition("/")
    (app,) = yaml.safe_load(_rayservice()["spec"]["serveConfigV2"])["applications"]
    assert user == app["args"]["settings"]["neo4j"]["user"]
    variable = re.fullmatch(r"\$\(([A-Z0-9_]+)\)", password).group(1)
    # A variable is expanded only when defined before the one that refers to it.
    assert names.index(variable) < names.index("NEO4J_AUTH")
    assert _env(container)[variable]["valueFrom"]["secretKeyRef"]["key"] == "NEO4J__PASSWORD"
    assert not variable.startswith("NEO4J_")
    for setting in (
        "NEO4J_server_memory_heap_initial__size",
        "NEO4J_server_memory_heap_max__size",
        "NEO4J_server_memory_pagecache_size",
    ):
        assert setting in names
    for name in names:
        assert not name.startswith("NEO4J_") or re.match(r"NEO4J_(AUTH$|server_|dbms_)", name)


def test_postgres_holds_the_databases_and_the_user_the_gateway_names():
    statefulset = _one("StatefulSet", "postgres")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    init = _one("ConfigMap", "postgres-init")["data"]
    created = {env["POSTGRES_DB"]["value"]} | set(
        re.findall(r"CREATE DATABASE (\w+)", "\n".join(init.values()))
    )
    head = _rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    urls = [_env(head["containers"][0])[n]["value"] for n in ("STATE__URL", "AUDIT__URL")]
    urls.append(_env(_consumer_container())["STATE__URL"]["value"])
    for value in urls:
        url = urlsplit(value)
        assert url.username == env["POSTGRES_USER"]["value"], value
        assert url.path.lstrip("/") in created, value
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "PGPASSWORD"
    assert _env(_consumer_container())["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == (
        "PGPASSWORD"
    )
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["init"] == "/docker-entrypoint-initdb.d"
    assert env["PGDATA"]["value"].startswith(mounts["data"] + "/")


def test_nats_runs_jetstream_on_its_volume():
    statefulset = _one("StatefulSet", "nats")
    spec = statefulset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_path = container["command"][container["command"].index("--config") + 1]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
    config = _one("ConfigMap", volume["configMap"]["name"])["data"]
    assert config_path == f"{mounts['config']}/nats.conf" and "nats.conf" in config
    jetstream = re.search(r"jetstream \{(.*?)\}", config["nats.conf"], re.S)
    assert jetstream, "JetStream is not enabled"
    store = re.search(r"store_dir: (\S+)", jetstream.group(1)).group(1)
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert store.startswith(mounts[claim["metadata"]["name"]] + "/")
    max_file = re.search(r"max_file_store: (\d+)GB", jetstream.group(1)).group(1)
    assert int(max_file) * 1e9 < _quantity(claim["spec"]["resources"]["requests"]["storage"])

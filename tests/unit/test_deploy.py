"""docker-compose.yml and infra/ against the code: services, commands, durable consumers, schemas.

The deployment files name things the code decides (the services of `specops serve`, the
durable consumers KEDA scales on, the NATS monitoring port, the engine server's queue-wait
metric), so they are read here and compared with the code, and validated against the
compose-spec and Kubernetes schemas.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from infra_render import render

from specops.runtime.nats_server import find_binary
from specops.runtime.topology import bus_consumers
from specops_services import service_specs
from specplatform.service_spec import Scaling

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
INFRA = ROOT / "infra"
BASE = INFRA / "base"
NATS_CONF = BASE / "nats.conf"

# `specops serve engine` is the inference server, not a platform service: no bus, no
# database, its own HTTP port and autoscaler (test_the_engine_* below).
ENGINE = "engine"
SERVICES = service_specs()
# KEDA scales them on their consumers' backlog (the gateway, which answers HTTP, an HPA on CPU).
BUS_SERVICES = sorted(name for name, spec in SERVICES.items() if spec.scaling is Scaling.BACKLOG)
# The engine's queue-wait histogram (the brief's contract, vLLM's name under `specops:`).
QUEUE_WAIT = "specops:request_queue_time_seconds"
# Compose services that run once and exit: no healthcheck.
ONE_SHOT = ("init", "nats-auth")
# Kinds served by custom resource definitions, which kubernetes-validate has no schema for;
# their required fields are checked by hand below.
CRD_KINDS = {"ScaledObject"}
KUSTOMIZATION = "kustomization.yaml"
# The oldest release the manifests must be valid for (autoscaling/v2, batch/v1 ttl).
KUBERNETES_VERSION = "1.30.0"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / KUSTOMIZATION).read_text())


def _kustomization_dirs() -> list[Path]:
    return sorted(path.parent for path in INFRA.rglob(KUSTOMIZATION))


def _resource_files(directory: Path) -> list[Path]:
    """The files a kustomization lists as resources (not the directories: other kustomizations)."""
    listed = (directory / entry for entry in _kustomization(directory).get("resources", []))
    return [path for path in listed if path.is_file()]


def _base_objects() -> list[dict[str, Any]]:
    return [doc for path in _resource_files(BASE) for doc in _documents(path)]


def _objects(kind: str, objects: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    found = [doc for doc in (objects if objects is not None else _base_objects()) if doc["kind"] == kind]
    names = Counter(doc["metadata"]["name"] for doc in found)
    assert all(n == 1 for n in names.values()), f"{kind} names repeated: {names}"
    return {doc["metadata"]["name"]: doc for doc in found}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, deployment["metadata"]["name"]
    return containers[0]


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _nats_monitoring_port() -> int:
    match = re.search(r"^http_port:\s*(\d+)\s*$", NATS_CONF.read_text(), re.MULTILINE)
    assert match, "nats.conf sets no http_port (the monitoring endpoint KEDA polls)"
    return int(match.group(1))


# --- the code's side ---------------------------------------------------------------------


def test_topology_names_every_service_and_its_consumers() -> None:
    consumers = bus_consumers()
    assert set(consumers) == set(SERVICES)
    for service, found in consumers.items():
        assert found, f"{service} binds no consumer"
        prefix = SERVICES[service].load().bus_name + "-"
        for consumer in found:
            assert consumer.durable.startswith(prefix), consumer
            # SPEC's subjects, or the upstream requests of SPEC_INTAKE (the gateway's intake).
            prefix_of_stream = {"SPEC": "spec.", "SPEC_INTAKE": "specops.intake."}[consumer.stream]
            assert consumer.subjects and all(s.startswith(prefix_of_stream) for s in consumer.subjects), (
                consumer
            )
    durables = [c.durable for found in consumers.values() for c in found]
    assert len(durables) == len(set(durables))
    assert {"predictor-plan", "predictor-dead_letter", "audit-record"} <= set(durables)


# --- docker-compose.yml ------------------------------------------------------------------


def test_compose_runs_every_service_from_one_image() -> None:
    services = _compose()["services"]
    for name in SERVICES:
        assert name in services, f"docker-compose.yml has no {name}"
        assert services[name]["command"] == ["serve", name]
    images = {services[name]["image"] for name in [*SERVICES, "init"]}
    builds = {services[name]["build"] for name in [*SERVICES, "init"]}
    assert len(images) == 1 and builds == {"."}


def test_compose_bus_services_scale() -> None:
    """`docker compose up --scale svc=N` needs no fixed container name and no fixed host port."""
    services = _compose()["services"]
    for name in BUS_SERVICES:
        assert "container_name" not in services[name], name
        assert "ports" not in services[name], name


def test_compose_waits_for_healthy_dependencies() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck")
        assert check and not check.get("disable") and check["test"], f"{name} has no healthcheck"
    for name in SERVICES:
        assert services[name]["depends_on"] == {
            "nats": {"condition": "service_healthy"},
            "postgres": {"condition": "service_healthy"},
            "init": {"condition": "service_completed_successfully"},
        }, name
    assert services["init"]["command"] == ["init"]
    assert services["init"]["restart"] == "no"
    for dependency in services["init"]["depends_on"].values():
        assert dependency == {"condition": "service_healthy"}


def test_compose_uses_the_infra_nats_config() -> None:
    nats = _compose()["services"]["nats"]
    assert "./infra/compose/nats.conf:/etc/nats/nats.conf:ro" in nats["volumes"]
    assert "./infra/base/nats.conf:/etc/nats/base.conf:ro" in nats["volumes"]
    assert nats["command"] == ["-c", "/etc/nats/nats.conf"]
    assert f":{_nats_monitoring_port()}/healthz" in " ".join(nats["healthcheck"]["test"])


def test_compose_nats_takes_only_the_users_nats_auth_writes(tmp_path: Path) -> None:
    """The compose server config, as nats-server reads it, with the users `nats-auth` writes."""
    services = _compose()["services"]
    assert services["nats-auth"]["command"] == ["nats", "config", "--write", "/auth"]
    assert services["nats"]["depends_on"] == {"nats-auth": {"condition": "service_completed_successfully"}}
    assert "nats-auth:/etc/nats/auth:ro" in services["nats"]["volumes"]
    for name in [*SERVICES, "init"]:
        assert "nats-auth:/auth:ro" in services[name]["volumes"], name
        assert services[name]["environment"]["NATS_NKEY_SEED_DIR"] == "/auth/nats/keys", name
    # Lay the files out as the container sees them and let nats-server check the result.
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "nats.conf").write_text((ROOT / "infra/compose/nats.conf").read_text())
    base = (ROOT / "infra/base/nats.conf").read_text().replace("/data", str(tmp_path / "data"))
    (etc / "base.conf").write_text(base)
    env = os.environ | {"SPECOPS_STATE_DIR": str(tmp_path / "state")}
    cli = [sys.executable, "-m", "specops.cli", "nats", "config", "--write", str(etc / "auth")]
    subprocess.run(cli, env=env, check=True, capture_output=True, timeout=120)
    assert (etc / "auth/nats/keys/quality-gate.nk").is_file()
    checked = subprocess.run(
        [str(find_binary()), "-c", str(etc / "nats.conf"), "-t"], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0 and "is valid" in checked.stdout + checked.stderr, checked.stderr
    text = (etc / "auth/nats/auth.conf").read_text()
    assert text.count('"nkey"') == 2 + len(SERVICES)  # admin, engine, services


def _compose_schema() -> dict[str, Any]:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(vendored.read_text())


def _compose_errors(document: dict[str, Any]) -> list[str]:
    schema = _compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_runs_the_engine_on_demand() -> None:
    """The engine server is a profile: `docker compose up` alone starts the platform only."""
    engine = _compose()["services"][ENGINE]
    assert engine["profiles"] == [ENGINE]
    command = engine["command"]
    assert command[:2] == ["serve", ENGINE]
    port = dict(zip(command[2::2], command[3::2], strict=True))["--port"]
    assert engine["ports"] == [f"{port}:{port}"]
    assert f"127.0.0.1:{port}/health" in " ".join(engine["healthcheck"]["test"])


def test_compose_validates_against_the_compose_spec() -> None:
    document = _compose()
    assert _compose_errors(document) == []
    # The schema is live: a healthcheck interval that is not a duration string is rejected.
    broken = copy.deepcopy(document)
    broken["services"]["audit"]["healthcheck"]["interval"] = {"seconds": 30}
    assert _compose_errors(broken)


# --- infra/ ------------------------------------------------------------------------------


def _platform(objects: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: doc for name, doc in objects.items() if name != ENGINE}


def test_every_service_has_a_deployment_running_it() -> None:
    deployments = _platform(_objects("Deployment"))
    assert set(deployments) == set(SERVICES)
    for name, deployment in deployments.items():
        container = _container(deployment)
        assert container["image"] == "specops", name
        assert container["args"] == ["serve", name]
        assert {"configMapRef": {"name": "specops-config"}} in container["envFrom"], name
        database = {e["name"]: e for e in container["env"]}["DATABASE_URL"]
        assert database["valueFrom"]["secretKeyRef"] == {"name": "specops-database", "key": "DATABASE_URL"}
        assert container["resources"]["requests"], name
        assert "livenessProbe" in container and "readinessProbe" in container, name
        if name in BUS_SERVICES:
            # KEDA owns the replicas; a fixed count would reset them on every apply.
            assert "replicas" not in deployment["spec"], name
    config = _objects("ConfigMap")["specops-config"]["data"]
    assert config["NATS_URL"] == "nats://nats:4222"


def test_prometheus_scrapes_every_service_on_its_ops_port() -> None:
    """The pods carry the annotations Prometheus' kubernetes-pods job reads, and serve
    /metrics (specplatform.ops) on the port they name; compose sets the same port."""
    config = _objects("ConfigMap")["specops-config"]["data"]
    port = int(config["SPECOPS_METRICS_PORT"])
    assert config["SPECOPS_METRICS_HOST"] == "0.0.0.0"
    for name, deployment in _platform(_objects("Deployment")).items():
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }, name
        ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
        assert ports["metrics"] == port, name
    services = _compose()["services"]
    for name in SERVICES:
        environment = services[name]["environment"]
        assert (environment["SPECOPS_METRICS_HOST"], environment["SPECOPS_METRICS_PORT"]) == (
            "0.0.0.0",
            str(port),
        ), name


def _jetstream_triggers(scaled: dict[str, Any]) -> list[dict[str, str]]:
    triggers = scaled["spec"]["triggers"]
    assert all(t["type"] == "nats-jetstream" for t in triggers), scaled["metadata"]["name"]
    return [t["metadata"] for t in triggers]


def _check_scaled_objects(objects: list[dict[str, Any]]) -> None:
    """One ScaledObject per bus service, one trigger per durable consumer the code binds."""
    scaled_objects = _platform(_objects("ScaledObject", objects))
    deployments = _objects("Deployment", objects)
    services = {name: _objects("Service", objects)[name] for name in ("nats",)}
    monitor_port = _nats_monitoring_port()
    assert {"name": "monitor", "port": monitor_port, "targetPort": "monitor"} in services["nats"]["spec"][
        "ports"
    ]
    consumers = bus_consumers()
    assert set(scaled_objects) == set(BUS_SERVICES)
    for name, scaled in scaled_objects.items():
        assert scaled["spec"]["scaleTargetRef"]["name"] == name
        assert name in deployments
        triggers = _jetstream_triggers(scaled)
        names = [t["consumer"] for t in triggers]
        assert sorted(names) == sorted(c.durable for c in consumers[name]), name
        namespace = deployments[name]["metadata"].get("namespace", "specops")
        for trigger in triggers:
            assert trigger["stream"] == "SPEC"
            assert trigger["account"] == "$G"
            assert (
                trigger["natsServerMonitoringEndpoint"]
                == f"nats.{namespace}.svc.cluster.local:{monitor_port}"
            )


def test_scaled_objects_name_the_code_consumers() -> None:
    _check_scaled_objects(_base_objects())


def test_scaled_objects_have_the_fields_keda_requires() -> None:
    """ScaledObject is KEDA's CRD (keda.sh/v1alpha1): no bundled schema, so its shape by hand."""
    for name, scaled in _objects("ScaledObject").items():
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        spec = scaled["spec"]
        assert set(spec) <= {
            "scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
            "cooldownPeriod", "idleReplicaCount", "fallback", "advanced", "triggers",
        }, name  # fmt: skip
        assert isinstance(spec["scaleTargetRef"]["name"], str)
        assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
        low, high = spec["minReplicaCount"], spec["maxReplicaCount"]
        assert isinstance(low, int) and isinstance(high, int) and 0 <= low <= high, name
        assert spec["triggers"], name
        for trigger in spec["triggers"]:
            # KEDA's trigger metadata is a map of strings.
            assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
            assert set(trigger) <= {"type", "metadata", "metricType", "name", "authenticationRef"}, trigger
            assert trigger.get("metricType", "AverageValue") in {"AverageValue", "Value", "Utilization"}
            required = {
                "nats-jetstream": {"natsServerMonitoringEndpoint", "stream", "consumer"},
                "prometheus": {"serverAddress", "query", "threshold"},
            }[trigger["type"]]
            assert required <= set(trigger["metadata"]), trigger


def test_measuring_services_never_share_a_node() -> None:
    deployments = _objects("Deployment")
    measuring = {"benchmark-runner", "quality-gate", "head-trainer"}
    for name in measuring:
        pod = deployments[name]["spec"]["template"]
        assert pod["metadata"]["labels"]["specops/measures"] == "true"
        (rule,) = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert rule["topologyKey"] == "kubernetes.io/hostname"
        assert rule["labelSelector"]["matchLabels"] == {"specops/measures": "true"}
    for name in set(deployments) - measuring:
        assert "specops/measures" not in deployments[name]["spec"]["template"]["metadata"]["labels"]
    # The engine loads the cores as much: it keeps off a measuring service's node too.
    engine = deployments[ENGINE]["spec"]["template"]["spec"]
    (rule,) = engine["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    assert rule["labelSelector"]["matchLabels"] == {"specops/measures": "true"}


def test_the_gateway_is_served_and_scaled_on_cpu() -> None:
    on_cpu = {name for name, spec in SERVICES.items() if spec.scaling is Scaling.CPU}
    assert set(_objects("HorizontalPodAutoscaler")) == on_cpu == {"gateway"}
    hpa = _objects("HorizontalPodAutoscaler")["gateway"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    gateway = _objects("Deployment")["gateway"]
    service = _objects("Service")["gateway"]
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for p in _container(gateway)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    config = _objects("ConfigMap")["specops-config"]["data"]
    assert ports["http"] == int(config["SPECOPS_GATEWAY_PORT"])


def test_the_engine_serves_openai_health_and_metrics_on_one_port() -> None:
    deployment = _objects("Deployment")[ENGINE]
    container = _container(deployment)
    args = container["args"]
    assert args[:2] == ["serve", ENGINE]
    flags = dict(zip(args[2::2], args[3::2], strict=True))
    assert {"--model", "--method", "--host", "--port"} <= set(flags)
    assert flags["--host"] == "0.0.0.0"
    # What the container is started with comes from the ConfigMaps it reads (the NATS URL
    # from the platform's, where the tenants' security policies are).
    configs = _objects("ConfigMap")
    settings = configs["specops-engine"]["data"] | configs["specops-config"]["data"]
    assert {"configMapRef": {"name": "specops-engine"}} in container["envFrom"]
    assert {"configMapRef": {"name": "specops-config"}} in container["envFrom"]
    assert flags["--nats-url"] == "$(NATS_URL)"
    for value in flags.values():
        for variable in re.findall(r"\$\((\w+)\)", value):
            assert variable in settings, variable
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(flags["--port"])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": flags["--port"],
        "prometheus.io/path": "/metrics",
    }
    assert "replicas" not in deployment["spec"]  # KEDA owns them
    service = _objects("Service")[ENGINE]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_the_engine_scales_on_its_queue_wait() -> None:
    """KEDA's Prometheus scaler on the p90 of the queue-wait histogram of the model served."""
    scaled = _objects("ScaledObject")[ENGINE]
    assert scaled["spec"]["scaleTargetRef"]["name"] == ENGINE
    assert scaled["spec"]["minReplicaCount"] >= 1  # a cold start loads the model
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    query = " ".join(trigger["metadata"]["query"].split())
    assert f"rate({QUEUE_WAIT}_bucket{{" in query and "histogram_quantile(0.9, sum by (le)" in query
    assert float(trigger["metadata"]["threshold"]) > 0
    model = _objects("ConfigMap")["specops-engine"]["data"]["SPECOPS_ENGINE_MODEL"]
    assert re.search(r'model_name="([^"]+)"', query).group(1) == model  # type: ignore[union-attr]
    # An idle engine (0/0 = NaN) reads as no wait, not as an error.
    assert query.endswith("or vector(0)")


@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda p: str(p.relative_to(INFRA)))
def test_kustomizations_list_every_file_in_their_directory(directory: Path) -> None:
    kustomization = _kustomization(directory)
    listed = [
        *kustomization.get("resources", []),
        *(patch["path"] for patch in kustomization.get("patches", []) if "path" in patch),
        *(f for gen in kustomization.get("configMapGenerator", []) for f in gen.get("files", [])),
    ]
    for entry in listed:
        assert (directory / entry).exists(), f"{directory}: {entry} is listed but missing"
    present = {p.name for p in directory.iterdir() if p.is_file()} - {KUSTOMIZATION}
    assert present == {entry for entry in listed if (directory / entry).is_file()}


@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda p: str(p.relative_to(INFRA)))
def test_manifests_validate_against_the_kubernetes_schemas(directory: Path) -> None:
    for path in _resource_files(directory):
        for doc in _documents(path):
            if doc["kind"] not in CRD_KINDS:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_validator_is_live() -> None:
    deployment = copy.deepcopy(_objects("Deployment")["predictor"])
    _container(deployment)["args"] = "serve predictor"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda p: str(p.relative_to(INFRA)))
def test_each_kustomization_builds_to_valid_manifests(directory: Path) -> None:
    """What `kubectl apply -k` would send, valid for the oldest release supported and the newest
    kubernetes-validate knows."""
    objects = render(directory)
    for doc in objects:
        if doc["kind"] not in CRD_KINDS:
            for version in (KUBERNETES_VERSION, kubernetes_validate.utils.latest_version()):
                kubernetes_validate.validate(doc, version, strict=True)
    _check_scaled_objects(objects)


def test_production_uses_an_external_database_and_a_pinned_image() -> None:
    objects = render(INFRA / "overlays" / "production")
    assert "postgres" not in _objects("StatefulSet", objects)
    assert "postgres" not in _objects("Service", objects)
    assert "specops-database" not in _objects("Secret", objects)
    for deployment in _objects("Deployment", objects).values():
        image = _container(deployment)["image"]
        assert re.fullmatch(r".+/specops:[0-9][\w.-]*", image), image

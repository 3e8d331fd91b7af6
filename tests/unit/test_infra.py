"""The Kubernetes manifests' hardening, on what `kubectl kustomize` renders for the base and
each overlay: what a container may do, who may reach which pod, how many replicas a drain
takes at once, which image runs, and that NATS takes no anonymous client.

tests/unit/test_deploy.py checks the same renderings against the Kubernetes schemas and the
code's services and consumers.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from infra_render import INFRA, kustomization_dirs, render
from nats.errors import Error as NatsError

from specops.runtime.nats_server import find_binary

ROOT = INFRA.parent
BASE = INFRA / "base"
PRODUCTION = INFRA / "overlays" / "production"
DIRS = kustomization_dirs()
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
NAMESPACE = "specops"
NATS_PORT, POSTGRES_PORT, DNS_PORT = 4222, 5432, 53
# The image's writable places (Dockerfile: its state dir, also HOME) besides the temp dir.
SPECOPS_WRITES = {"/tmp", "/var/lib/specops"}
# Where Prometheus and KEDA run (network-policy.yaml names them), and a namespace of neither.
MONITORING, KEDA, ELSEWHERE = "monitoring", "keda", "ingress-nginx"
# An address outside the cluster: an external Postgres, a model hub, anything on the internet.
OUTSIDE = "203.0.113.7"


def _id(directory: Path) -> str:
    return str(directory.relative_to(INFRA))


@pytest.fixture(scope="module")
def rendered() -> dict[Path, list[dict[str, Any]]]:
    return {directory: render(directory) for directory in DIRS}


def _of_kind(objects: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [doc for doc in objects if doc["kind"] in kinds]


def _named(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _of_kind(objects, kind)}


def _pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def _is_specops(pod: dict[str, Any]) -> bool:
    return pod["metadata"]["labels"].get("app.kubernetes.io/name") == "specops"


def _project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


# --- what a container may do --------------------------------------------------------------


@pytest.mark.parametrize("directory", DIRS, ids=_id)
def test_every_container_runs_confined(rendered: dict[Path, list[dict[str, Any]]], directory: Path) -> None:
    """No root, no privilege escalation, no capability, the runtime's seccomp filter, a
    read-only root filesystem, no service account token: in every pod, NATS and Postgres too."""
    workloads = _of_kind(rendered[directory], *WORKLOADS)
    assert {w["metadata"]["name"] for w in workloads} >= {"gateway", "engine", "nats", "specops-init"}
    for workload in workloads:
        pod = _pod_template(workload)
        name = workload["metadata"]["name"]
        spec = pod["spec"]
        assert spec.get("automountServiceAccountToken") is False, name
        assert not any(spec.get(host) for host in ("hostNetwork", "hostPID", "hostIPC")), name
        for container in _containers(pod):
            own = container.get("securityContext", {})
            effective = spec.get("securityContext", {}) | own
            where = f"{name}/{container['name']}"
            assert own.get("allowPrivilegeEscalation") is False, where
            assert own.get("readOnlyRootFilesystem") is True, where
            assert own.get("capabilities") == {"drop": ["ALL"]}, where
            assert not own.get("privileged"), where
            assert effective.get("runAsNonRoot") is True, where
            assert isinstance(effective.get("runAsUser"), int) and effective["runAsUser"] > 0, where
            assert effective.get("seccompProfile") == {"type": "RuntimeDefault"}, where


@pytest.mark.parametrize("directory", DIRS, ids=_id)
def test_read_only_containers_can_write_where_their_process_writes(
    rendered: dict[Path, list[dict[str, Any]]], directory: Path
) -> None:
    """A read-only root needs a volume wherever the process writes, or it fails at its first write."""
    objects = rendered[directory]
    for workload in _of_kind(objects, *WORKLOADS):
        pod = _pod_template(workload)
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        for container in _containers(pod):
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            for path, volume in mounts.items():
                assert volume in volumes or volume in claims, (workload["metadata"]["name"], volume)
                if "emptyDir" in volumes.get(volume, {}):
                    # A pod that fills its node's disk is evicted, not the node.
                    assert volumes[volume]["emptyDir"].get("sizeLimit"), (workload["metadata"]["name"], path)
            needed = {
                "nats": {"/data"},  # JetStream's store_dir (nats.conf)
                "postgres": {"/var/lib/postgresql", "/var/run/postgresql", "/tmp"},
            }.get(container["name"], SPECOPS_WRITES)
            assert needed <= set(mounts), (workload["metadata"]["name"], needed - set(mounts))
    nats_conf = (BASE / "nats.conf").read_text()
    assert "store_dir: /data\n" in nats_conf


# --- images -------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", DIRS, ids=_id)
def test_images_are_pinned_to_the_release(
    rendered: dict[Path, list[dict[str, Any]]], directory: Path
) -> None:
    """Every pod of a Deployment runs the same code: no `latest`, no untagged image, and the
    specops image is the release pyproject.toml names."""
    version = _project_version()
    for workload in _of_kind(rendered[directory], *WORKLOADS):
        for container in _containers(_pod_template(workload)):
            image = container["image"]
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag and tag not in ("", "latest"), image
            if name.rsplit("/", 1)[-1] == "specops":
                assert tag == version, image


# --- disruption budgets -------------------------------------------------------------------


def _max_replicas(objects: list[dict[str, Any]], deployment: dict[str, Any]) -> int:
    name = deployment["metadata"]["name"]
    for scaler in _of_kind(objects, "HorizontalPodAutoscaler"):
        if scaler["spec"]["scaleTargetRef"]["name"] == name:
            return int(scaler["spec"]["maxReplicas"])
    for scaler in _of_kind(objects, "ScaledObject"):
        if scaler["spec"]["scaleTargetRef"]["name"] == name:
            return int(scaler["spec"]["maxReplicaCount"])
    return int(deployment["spec"].get("replicas", 1))


@pytest.mark.parametrize("directory", DIRS, ids=_id)
def test_deployments_that_run_several_replicas_have_a_disruption_budget(
    rendered: dict[Path, list[dict[str, Any]]], directory: Path
) -> None:
    """A node drain takes one replica at a time, and never blocks on a single one."""
    objects = rendered[directory]
    budgets = _of_kind(objects, "PodDisruptionBudget")
    several = [d for d in _of_kind(objects, "Deployment") if _max_replicas(objects, d) > 1]
    assert {d["metadata"]["name"] for d in several} >= {"gateway", "predictor", "engine", "audit"}
    for deployment in several:
        labels = _pod_template(deployment)["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, deployment["metadata"]["name"]
        assert covering[0]["spec"] == {"maxUnavailable": 1, "selector": covering[0]["spec"]["selector"]}


# --- who may reach whom -------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One side of a connection: a pod (its namespace and labels) or an address outside."""

    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)
    ip: str | None = None


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # what this evaluator understands
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_matches(peer: dict[str, Any], other: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if other.ip is None:
            return False
        address = ipaddress.ip_address(other.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", [])
        )
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        namespace = {"kubernetes.io/metadata.name": other.namespace}
        if not _selects(peer["namespaceSelector"], namespace):
            return False
    elif other.namespace != NAMESPACE:
        return False
    return _selects(peer.get("podSelector", {}), other.labels)


def _rule_allows(rule: dict[str, Any], peers_key: str, other: Endpoint, port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if ports is not None and not any(
        p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports
    ):
        return False
    peers = rule.get(peers_key)
    return peers is None or any(_peer_matches(peer, other) for peer in peers)


def _direction_allows(
    policies: list[dict[str, Any]], direction: str, pod: Endpoint, other: Endpoint, port: int, protocol: str
) -> bool:
    """NetworkPolicy's rule: a pod no policy selects for `direction` is open, a selected one
    takes what any of the selecting policies' rules allow."""
    if pod.namespace != NAMESPACE:
        return True  # nothing here governs pods of other namespaces
    selecting = [
        p
        for p in policies
        if direction in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod.labels)
    ]
    if not selecting:
        return True
    rules_key, peers_key = {"Ingress": ("ingress", "from"), "Egress": ("egress", "to")}[direction]
    return any(
        _rule_allows(rule, peers_key, other, port, protocol)
        for p in selecting
        for rule in p["spec"].get(rules_key, [])
    )


def _allowed(
    policies: list[dict[str, Any]], source: Endpoint, target: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    return _direction_allows(policies, "Egress", source, target, port, protocol) and _direction_allows(
        policies, "Ingress", target, source, port, protocol
    )


def _pods(objects: list[dict[str, Any]]) -> dict[str, tuple[Endpoint, dict[str, Any]]]:
    return {
        w["metadata"]["name"]: (Endpoint(NAMESPACE, _pod_template(w)["metadata"]["labels"]), _pod_template(w))
        for w in _of_kind(objects, *WORKLOADS)
    }


def _env_names(pod: dict[str, Any]) -> set[str]:
    return {e["name"] for c in _containers(pod) for e in c.get("env", [])}


def _metrics_port(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"]["prometheus.io/port"])


@pytest.mark.parametrize("directory", DIRS, ids=_id)
def test_network_policies_deny_by_default_and_allow_what_the_code_connects_to(
    rendered: dict[Path, list[dict[str, Any]]], directory: Path
) -> None:
    objects = rendered[directory]
    policies = _of_kind(objects, "NetworkPolicy")
    deny = _named(objects, "NetworkPolicy")["default-deny"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    pods = _pods(objects)
    nats_pod = pods["nats"][0]
    in_cluster_postgres = "postgres" in pods
    database = pods["postgres"][0] if in_cluster_postgres else Endpoint(None, ip=OUTSIDE)
    dns = Endpoint("kube-system", {"k8s-app": "kube-dns"})
    anywhere = Endpoint(ELSEWHERE, {"app": "client"})
    internet = Endpoint(None, ip=OUTSIDE)
    specops = {name: pod for name, pod in pods.items() if _is_specops(pod[1])}
    assert {"gateway", "engine", "specops-init", "audit"} <= set(specops)
    for name, (pod, template) in specops.items():
        # Every specops process is on the bus (the engine for the tenants' policies).
        assert _allowed(policies, pod, nats_pod, NATS_PORT), name
        assert _allowed(policies, pod, dns, DNS_PORT, "UDP"), name
        # Postgres exactly for the processes given a DATABASE_URL.
        uses_database = "DATABASE_URL" in _env_names(template)
        assert _allowed(policies, pod, database, POSTGRES_PORT) == uses_database, name
        # Nothing else leaves: no other port of NATS, no internet, no other specops pod.
        assert not _allowed(policies, pod, nats_pod, 8222), name
        assert not _allowed(policies, pod, internet, 443), name
        assert not _allowed(policies, pod, pods["gateway"][0], 8787), name
        # Prometheus scrapes each from its namespace; a client elsewhere does not.
        if "annotations" in template["metadata"]:
            port = _metrics_port(template)
            assert _allowed(policies, Endpoint(MONITORING), pod, port), name
            if name not in ("gateway", "engine"):
                assert not _allowed(policies, anywhere, pod, port), name
    # The public ports, from any namespace (an ingress controller's, a client's).
    assert _allowed(policies, anywhere, pods["gateway"][0], 8787)
    assert _allowed(policies, anywhere, pods["engine"][0], 8000)
    assert not _allowed(policies, anywhere, pods["gateway"][0], 9464)
    # NATS: clients only from the specops pods, the monitoring port only for KEDA.
    assert not _allowed(policies, anywhere, nats_pod, NATS_PORT)
    assert not _allowed(policies, Endpoint(KEDA), nats_pod, NATS_PORT)
    assert _allowed(policies, Endpoint(KEDA), nats_pod, 8222)
    assert not _allowed(policies, anywhere, nats_pod, 8222)
    # NATS and Postgres start no connection of their own.
    assert not _allowed(policies, nats_pod, internet, 443)
    assert not _allowed(policies, nats_pod, dns, DNS_PORT, "UDP")
    if in_cluster_postgres:
        assert not _allowed(policies, anywhere, database, POSTGRES_PORT)
        assert not _allowed(policies, database, internet, 443)


def test_pods_that_use_the_database_carry_the_label_its_policy_selects(
    rendered: dict[Path, list[dict[str, Any]]],
) -> None:
    """The label follows what the code reads, so a new service with a DATABASE_URL cannot be
    left without its route (or the engine given one)."""
    for name, (pod, template) in _pods(rendered[BASE]).items():
        if _is_specops(template):
            uses_database = "DATABASE_URL" in _env_names(template)
            assert (pod.labels.get("specops/database") == "true") == uses_database, name


# --- NATS takes nkey users only -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def nats_users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the operator generates for the Secret specops-nats (infra/README.md)."""
    out = tmp_path_factory.mktemp("nats-auth")
    env = os.environ | {"SPECOPS_STATE_DIR": str(out / "state")}
    cli = [sys.executable, "-m", "specops.cli", "nats", "config", "--write", str(out)]
    subprocess.run(cli, env=env, check=True, capture_output=True, timeout=120)
    return out / "nats"


def _secret_keys(nats_users: Path) -> dict[str, Path]:
    """The Secret's keys as `kubectl create secret generic specops-nats --from-file=DIR/nats/keys
    --from-file=DIR/nats/auth.conf` makes them: each file's name."""
    files = [*sorted((nats_users / "keys").iterdir()), nats_users / "auth.conf"]
    return {path.name: path for path in files}


def _lay_out_nats_config(objects: list[dict[str, Any]], secret: dict[str, Path], etc: Path) -> None:
    """/etc/nats of the NATS pod as its projected volume fills it."""
    statefulset = _named(objects, "StatefulSet")["nats"]
    pod = _pod_template(statefulset)
    (mount,) = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/nats"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    config_maps = _named(objects, "ConfigMap")
    for source in volume["projected"]["sources"]:
        if "configMap" in source:
            for key, text in config_maps[source["configMap"]["name"]]["data"].items():
                (etc / key).write_text(text)
        else:
            assert source["secret"]["name"] == "specops-nats"
            for item in source["secret"]["items"]:
                target = etc / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(secret[item["key"]], target)


@pytest.mark.parametrize("directory", DIRS, ids=_id)
def test_every_pod_mounts_a_seed_the_generated_secret_holds(
    rendered: dict[Path, list[dict[str, Any]]], directory: Path, nats_users: Path
) -> None:
    """Each specops pod gets one key of specops-nats: a service its own user (least privilege),
    and the Secret made from `specops nats config --write` has every key a pod names."""
    secret = _secret_keys(nats_users)
    config = _named(rendered[directory], "ConfigMap")
    seed_dir = next(c for name, c in config.items() if name.startswith("specops-config"))["data"][
        "NATS_NKEY_SEED_DIR"
    ]
    for name, (_, template) in _pods(rendered[directory]).items():
        if not _is_specops(template):
            continue
        (container,) = template["spec"]["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == mounts[seed_dir])
        assert volume["secret"]["secretName"] == "specops-nats"
        (item,) = volume["secret"]["items"]
        assert item["key"] in secret, item
        expected = "admin" if name == "specops-init" else name
        assert item == {"key": f"{expected}.nk", "path": f"{expected}.nk"}, name


@pytest.fixture
def base_nats_server(
    rendered: dict[Path, list[dict[str, Any]]], nats_users: Path, tmp_path: Path
) -> Iterator[str]:
    """nats-server with the base's config and the generated users, laid out as in the pod."""
    etc = tmp_path / "etc"
    etc.mkdir()
    _lay_out_nats_config(rendered[BASE], _secret_keys(nats_users), etc)
    conf = etc / "nats.conf"
    conf.write_text(conf.read_text().replace("store_dir: /data", f"store_dir: {tmp_path / 'data'}"))
    port = _free_port()
    process = subprocess.Popen(
        [str(find_binary()), "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-m", str(_free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "nats-server exited"
            time.sleep(0.1)
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_the_base_nats_refuses_anonymous_clients(base_nats_server: str, nats_users: Path) -> None:
    options: dict[str, Any] = {"allow_reconnect": False, "connect_timeout": 5}
    with pytest.raises(NatsError, match="[Aa]uthorization"):
        await nats.connect(base_nats_server, **options)
    client = await nats.connect(
        base_nats_server, nkeys_seed=str(nats_users / "keys" / "gateway.nk"), **options
    )
    try:
        assert client.is_connected
    finally:
        await client.close()


def test_the_base_nats_does_not_start_without_its_users(
    rendered: dict[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """No Secret, no server: the pod never comes up open."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config = next(
        c for name, c in _named(rendered[BASE], "ConfigMap").items() if name.startswith("nats-config")
    )
    (etc / "nats.conf").write_text(config["data"]["nats.conf"].replace("/data", str(tmp_path / "data")))
    checked = subprocess.run(
        [str(find_binary()), "-c", str(etc / "nats.conf"), "-t"], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode != 0
    assert "auth.conf" in checked.stdout + checked.stderr


# --- the files' own words -----------------------------------------------------------------


def test_infra_names_only_files_that_exist() -> None:
    """A comment pointing at a manifest that is not there sends an operator looking for it
    (nats.yaml once named a scaledobjects.yaml)."""
    present = {path.name for path in INFRA.rglob("*") if path.is_file()}
    for path in INFRA.rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".conf", ".md"}:
            for word in path.read_text().split():
                name = word.strip("`'\"(),.:;").rsplit("/", 1)[-1]
                if name.endswith(".yaml") and "*" not in name:
                    assert name in present, f"{path.relative_to(INFRA)} names {name}, which infra/ lacks"

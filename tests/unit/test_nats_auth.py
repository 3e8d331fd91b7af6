"""The NATS users `specops up` generates: what each may do, read off the services' code."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from specops.runtime.nats_auth import (
    ADMIN,
    Keys,
    all_users,
    render_config,
    service_permissions,
    tenant_permissions,
    tenant_user,
)
from specops.runtime.topology import bus_consumers, service_users
from specops_services import service_names
from specplatform.errors import RuntimeSetupError
from specplatform.settings import Settings


def test_each_service_may_pull_only_its_own_consumers_and_publish_only_its_events() -> None:
    users = {u.name: u for u in service_users()}
    consumers = bus_consumers()
    assert set(users) == set(consumers)
    allowed = {name: service_permissions(user) for name, user in users.items()}
    for name, perms in allowed.items():
        own = {c.durable for c in consumers[name]}
        pulls = {s.rsplit(".", 1)[1] for s in perms.publish if s.startswith("$JS.API.CONSUMER.MSG.NEXT.")}
        assert pulls == own, name
        assert perms.subscribe == (f"_INBOX.svc.{users[name].bus_name}.>",)
        assert ">" not in perms.publish and "spec.>" not in perms.publish
    # Only the benchmark-runner reports measurements, only the gate verdicts, only the
    # gateway takes requests in and answers tenants.
    assert [n for n, p in allowed.items() if "spec.bench.*.completed" in p.publish] == ["benchmark-runner"]
    assert [n for n, p in allowed.items() if "spec.gate.*.evaluated" in p.publish] == ["quality-gate"]
    assert [n for n, p in allowed.items() if "spec.run.*.requested" in p.publish] == ["gateway"]
    assert [n for n, p in allowed.items() if "specops.results.*.>" in p.publish] == ["gateway"]
    # T3: only the head-trainer announces trained heads.
    assert [n for n, p in allowed.items() if "spec.head.*.trained" in p.publish] == ["head-trainer"]
    pull_intake = "$JS.API.CONSUMER.MSG.NEXT.SPEC_INTAKE.gateway-intake"
    assert [n for n, p in allowed.items() if pull_intake in p.publish] == ["gateway"]
    # T2: the gateway asks for tune sessions and folds the tuner's answers on a durable of its own.
    assert [n for n, p in allowed.items() if "spec.tune.*.requested" in p.publish] == ["gateway"]
    pull_tune = "$JS.API.CONSUMER.MSG.NEXT.SPEC.gateway-tune_projector"
    assert [n for n, p in allowed.items() if pull_tune in p.publish] == ["gateway"]
    # T3: the gateway is the head registry's writer: it asks for heads, announces their moves and
    # folds the trainer's and the gate's head events on a durable of its own.
    assert [n for n, p in allowed.items() if "spec.head.*.requested" in p.publish] == ["gateway"]
    assert [n for n, p in allowed.items() if "spec.head.*.transitioned" in p.publish] == ["gateway"]
    pull_heads = "$JS.API.CONSUMER.MSG.NEXT.SPEC.gateway-heads_projector"
    assert [n for n, p in allowed.items() if pull_heads in p.publish] == ["gateway"]
    assert all(not any(s.startswith("$JS.API.STREAM.DELETE") for s in p.publish) for p in allowed.values())


def test_a_tenant_publishes_its_intake_and_reads_its_results_only() -> None:
    perms = tenant_permissions("acme")
    assert perms.publish == ("specops.intake.acme.run.requested",)
    assert perms.subscribe == ("specops.results.acme.>", "_INBOX.tenant.acme.>")
    with pytest.raises(RuntimeSetupError, match="invalid tenant id"):
        tenant_user("acme.>")


def test_keys_are_private_stable_and_only_public_keys_reach_the_config(tmp_path: Path) -> None:
    keys = Keys(tmp_path)
    admin = keys.ensure(ADMIN)
    assert keys.ensure(ADMIN) == admin and admin.startswith("U")
    assert stat.S_IMODE(keys.seed_file(ADMIN).stat().st_mode) == 0o600
    keys.ensure(tenant_user("acme"))
    assert keys.tenants() == ["acme"]
    users = all_users(keys, service_users())
    config = json.loads(
        render_config(host="127.0.0.1", port=4222, monitor_port=8222, store_dir=tmp_path, users=users)
    )
    listed = config["authorization"]["users"]
    assert len(listed) == len(users) == 2 + len(service_names()) + 1  # admin, engine, services, tenant
    text = json.dumps(config)
    for seed in keys.dir.glob("*.nk"):
        assert seed.read_text().strip() not in text


def test_settings_pass_a_seed_or_creds_file_to_nats_connect(tmp_path: Path) -> None:
    seed = tmp_path / "svc.nk"
    seed.write_text("SU...\n")
    assert Settings(nats_nkey_seed_file=seed).nats_credentials() == {"nkeys_seed": str(seed)}
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\n")
    assert Settings(nats_creds_file=creds).nats_credentials() == {"user_credentials": str(creds)}
    assert Settings().nats_credentials() == {}
    # A directory of every user's seed (compose): the CLI is admin (`specops serve S` is S).
    (tmp_path / "admin.nk").write_text("SU...\n")
    assert Settings(nats_nkey_seed_dir=tmp_path).nats_credentials() == {
        "nkeys_seed": str(tmp_path / "admin.nk")
    }
    with pytest.raises(RuntimeSetupError, match="does not exist"):
        Settings(nats_nkey_seed_file=tmp_path / "missing.nk").nats_credentials()

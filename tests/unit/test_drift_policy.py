"""The drift monitor's decisions (services/engine/drift.py): baseline, detection within the
window, probes, hysteresis, auto's n-gram / plain choice, and the request headers' key."""

from __future__ import annotations

import pytest

from specops_services.engine.drift import DriftKey, DriftMonitor, DriftPolicy, Measured, key_of

KEY = DriftKey("acme", "chat")
GOOD = Measured(drafted=10, accepted=5, drafts=4)  # acceptance 0.5
BAD = Measured(drafted=10, accepted=0, drafts=4)


def _run(monitor: DriftMonitor, m: Measured, n: int, key: DriftKey = KEY) -> list[object]:
    """``n`` requests of the key, each routed and then finished with ``m``; the transitions."""
    out = []
    for _ in range(n):
        method = monitor.route(key)
        out.append(monitor.observe(key, method, m))
    return out


def test_drift_is_detected_within_the_window_and_the_key_goes_to_the_fallback() -> None:
    monitor = DriftMonitor(DriftPolicy("eagle", "ngram", window=4, baseline_requests=3, probe_every=2))
    assert _run(monitor, GOOD, 3 + 4) == [None] * 7  # baseline, then a full window at the baseline
    assert monitor.state(KEY).baseline == 0.5
    found = _run(monitor, BAD, 4)
    assert found[0] is None  # 1 bad of 4: 0.375, not below 0.6 x 0.5
    t = found[1]  # 2 bad of 4: 0.25 < 0.3
    assert t is not None and t.kind == "detected" and t.method == "ngram"  # type: ignore[attr-defined]
    assert t.baseline == 0.5 and t.current == 0.25 and t.window == 4  # type: ignore[attr-defined]
    assert found[2:] == [None, None]  # an n-gram request, then a probe: the window restarted
    # On the fallback every 2nd request probes the primary; another key is untouched.
    assert [monitor.route(KEY) for _ in range(4)] == ["ngram", "eagle", "ngram", "eagle"]
    assert monitor.route(DriftKey()) == "eagle"


def test_recovery_needs_a_full_window_of_probes_at_the_recover_level() -> None:
    policy = DriftPolicy("eagle", "none", window=2, baseline=0.5, threshold=0.5, recover=0.8, probe_every=3)
    monitor = DriftMonitor(policy)
    assert _run(monitor, BAD, 2)[-1] is not None
    routed = [monitor.route(KEY) for _ in range(6)]
    assert routed == ["none", "none", "eagle"] * 2
    # 0.3 acceptance: above the drift bound (0.25), below the recovery bound (0.4): stays.
    middling = Measured(drafted=20, accepted=6, drafts=8)
    assert monitor.observe(KEY, "eagle", middling) is None
    assert monitor.observe(KEY, "eagle", middling) is None
    assert monitor.observe(KEY, "eagle", GOOD) is None  # (6 + 5) / 30 < 0.4
    assert monitor.active(KEY) == "none"
    t = monitor.observe(KEY, "eagle", GOOD)
    assert t is not None and t.kind == "recovered" and t.method == "eagle"
    assert monitor.route(KEY) == "eagle"


def test_auto_takes_plain_decoding_while_ngram_accepts_too_little_and_probes_ngram() -> None:
    policy = DriftPolicy("eagle", "auto", window=2, baseline=0.5, probe_every=2, auto_min_mal=1.5)
    monitor = DriftMonitor(policy)
    assert policy.methods == ("eagle", "ngram", "none")
    assert _run(monitor, BAD, 2)[-1] is not None
    assert monitor.active(KEY) == "ngram"
    monitor.observe(KEY, "ngram", Measured(drafted=10, accepted=1, drafts=5))  # 1.2 tokens per step
    monitor.observe(KEY, "ngram", Measured(drafted=10, accepted=1, drafts=5))
    assert monitor.active(KEY) == "none"
    assert [monitor.route(KEY) for _ in range(4)] == ["none", "eagle", "none", "ngram"]
    monitor.observe(KEY, "ngram", Measured(drafted=10, accepted=8, drafts=4))  # 3 tokens per step
    assert monitor.active(KEY) == "ngram"


def test_policy_and_key_checks() -> None:
    with pytest.raises(ValueError, match="fallback"):
        DriftPolicy("eagle", "medusa")
    with pytest.raises(ValueError, match="no draft"):
        DriftPolicy("ngram")
    with pytest.raises(ValueError, match="threshold < recover"):
        DriftPolicy("eagle", threshold=0.8, recover=0.7)
    assert key_of(None, "") == DriftKey("default", "default")
    assert key_of("acme", "code") == DriftKey("acme", "code")
    with pytest.raises(ValueError, match="X-Specops-Tenant"):
        key_of("a.b", None)

"""`specops serve engine`: speccore behind an OpenAI-compatible HTTP API, with Prometheus /metrics.

One worker thread owns the continuous batcher (`worker.py`); the FastAPI app (`app.py`) turns
OpenAI requests into speccore requests (`logic.py`), hands them to the worker and streams its
updates back as the OpenAI wire (`protocol.py`); `metrics.py` keeps vLLM's serving and
spec-decode metrics under the `specops:` prefix. With `--fallback`, `drift.py` watches the
method's acceptance per (tenant, workload) and switches a key that drifts to n-gram or plain
decoding and back; `drift_events.py` logs, counts and publishes those switches.
`tenant_auth.py` decides whether a request may speak for the tenant it names (a trusted
proxy's signature); `security.py` what that tenant's policy makes of it.
"""

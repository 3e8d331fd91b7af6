"""The HTTP gateway: the runs, tune-sessions, heads, security and datastores APIs, their SSE
streams, the web console, and the projectors that fold the bus's events into what they read.

Layout, by resource: `runs/`, `tune/`, `heads/`, `security/`, `datastores/` each hold their
own routes, service logic (`service.py`), SQL (`db.py`), pure decisions (`logic.py`) and
projection (`projection.py`: what an event writes; `projector.py`: its durable consumer).
A resource uses another only through the names its package exports (an import-linter
contract). `console/` is the HTML surface over the same resources. Shared by all: `http/`
(auth, problems, SSE, limits, uploads, parameters), `idempotency` (every POST's key and
replay), `projecting` (how a projector consumes), `results` (what tenants read back on
NATS), `winner_cache` and `db` (the SQL the resources share). `app` builds the FastAPI app
and registers the bus handlers; `settings` and `metrics` are the process's.
"""

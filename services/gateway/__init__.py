"""The HTTP gateway: T1 runs API, SSE progress, apply, and the run projector.

Layout: `app` (factory + lifespan), `routes` (HTTP surface), `runs` (what each endpoint
does), `auth` (bearer tokens, roles), `problems` (RFC 9457 errors), `projector` (bus
events -> runs/run_events), `listener` (LISTEN run_events), `logic` (pure decisions),
`db` (all SQL), `tokens` (issuing API tokens).
"""

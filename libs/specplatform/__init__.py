"""specplatform: what every specops service process stands on.

- `specplatform.db`: the Postgres pool, tenant-scoped transactions and the numbered
  SQL migrations runner;
- `specplatform.settings`: where a process finds NATS, Postgres and its state
  directory, and one loader for a service's own settings class;
- `specplatform.service`: a bus service's process lifecycle (migrations, pool, broker,
  outbox relay);
- `specplatform.service_spec`: a bus service declared once (`ServiceSpec`), for everything
  that lists the services;
- `specplatform.telemetry`: a process's traces, from the standard OTEL_* variables;
- `specplatform.body_limit`: an HTTP service's request body limit (ASGI), refused unread;
- `specplatform.tenant_signature`: a trusted proxy's signed tenant claim to the engine server;
- `specplatform.errors`: the one-line errors of all of the above.
"""

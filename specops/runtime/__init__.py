"""The local runtime: embedded NATS and PostgreSQL plus one process per service replica.

Import from the submodules: `specplatform.settings` (what every service reads),
`specops.runtime.supervisor` (up / down / status), `specops.runtime.stream` (the SPEC
stream), `specplatform.service` (a bus service's process: database, relay, app).
This package's import stays light because every service imports settings.
"""

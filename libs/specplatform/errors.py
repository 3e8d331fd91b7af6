"""The runtime's one error type: printed by the CLI as a single line."""

from __future__ import annotations

from speccore.errors import SpecError


class RuntimeSetupError(SpecError):
    """A server or service could not be started, found or stopped; the message says what to do."""

"""Which failures the bus retries without limit (the infrastructure's) and which it counts."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import psycopg
import psycopg.errors
import psycopg_pool
import pytest
from pydantic import BaseModel, ValidationError

from specbus import RetryPolicy
from specbus.faults import is_transient, publish_denied


class _Strict(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Strict.model_validate({"n": "many"})
    except ValidationError as exc:
        return exc
    raise AssertionError("validation passed")


def _raised_from(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as raised:
        return raised


def _raised_while_handling(exc: BaseException, handled: BaseException) -> BaseException:
    try:
        try:
            raise handled
        except BaseException:
            raise exc  # noqa: B904 - the implicit __context__ is what is under test
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.TooManyConnections("too many clients already"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
        nats.errors.ConnectionClosedError(),
        nats.errors.StaleConnectionError(),
        nats.errors.OutboundBufferLimitError(),
        nats.js.errors.NoStreamResponseError(),
        nats.js.errors.ServiceUnavailableError(code=503),
        ConnectionResetError("reset by peer"),
        TimeoutError(),  # asyncio.TimeoutError is this class
    ],
    ids=type,
)
def test_outages_of_postgres_and_nats_are_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("boom"),
        ValueError("bad payload"),
        KeyError("run"),
        RecursionError("maximum recursion depth exceeded"),
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.UndefinedTable('relation "runs" does not exist'),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg_pool.PoolClosed("the pool is closed"),
        nats.errors.MaxPayloadError(),
        nats.js.errors.BadRequestError(code=400, description="expected stream does not match"),
        FileNotFoundError("model.safetensors"),
    ],
    ids=type,
)
def test_failures_that_would_repeat_are_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_a_validation_error_is_permanent() -> None:
    assert not is_transient(_validation_error())


def test_an_outage_anywhere_in_the_chain_is_transient() -> None:
    outage = psycopg.OperationalError("server closed the connection unexpectedly")
    assert is_transient(_raised_from(RuntimeError("could not record the run"), outage))
    assert is_transient(_raised_while_handling(KeyError("run"), outage))
    deeper = _raised_from(RuntimeError("step failed"), _raised_from(ValueError("wrapped"), outage))
    assert is_transient(deeper)
    assert not is_transient(_raised_from(RuntimeError("step failed"), ValueError("bad payload")))


def test_a_group_is_transient_only_when_every_member_is() -> None:
    outage = psycopg_pool.PoolTimeout("no connection")
    assert is_transient(ExceptionGroup("tasks", [outage, nats.errors.TimeoutError()]))
    assert not is_transient(ExceptionGroup("tasks", [outage, ValueError("bad payload")]))


def test_a_chain_that_loops_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert not is_transient(first)


def test_a_permissions_violation_names_the_refused_subject() -> None:
    violation = nats.errors.Error('nats: Permissions Violation for Publish to "spec.run.r1.queued"')
    assert publish_denied("spec.run.r1.queued", violation)
    assert not publish_denied("spec.run.r2.queued", violation)
    assert not publish_denied("spec.run.r1.queued", None)
    assert not publish_denied("spec.run.r1.queued", nats.errors.TimeoutError())


def test_transient_retries_back_off_to_a_cap_and_go_on_forever() -> None:
    policy = RetryPolicy(transient_backoff_s=(1.0, 2.0, 30.0))
    assert [policy.transient_delay(n) for n in (1, 2, 3, 4, 1000)] == [1.0, 2.0, 30.0, 30.0, 30.0]
    with pytest.raises(ValueError, match="transient_backoff_s"):
        RetryPolicy(transient_backoff_s=())

"""The session's Optuna study, in Optuna's RDB storage in the project's Postgres (schema `optuna`).

Synchronous (Optuna's storage is SQLAlchemy): the steps call these through
`asyncio.to_thread`. The study is named after the session id and maximises the trial's
value. Optuna's writes are not in the tuner's transaction, so the two are reconciled:

- seeds are enqueued only into an empty study (a redelivered `tune.requested` whose
  first attempt rolled back finds them there);
- a RUNNING Optuna trial without a `tuner_trials` row was asked by a tuner that died
  (or rolled back) before its commit: it is told FAIL before the next ask, so it is
  never measured; a trial with a row is measured exactly once (its bench id is derived
  from its number);
- `tell` skips a finished trial, so a redelivered verdict is harmless.

Sampler: TPE, multivariate over the joint space with `group=True` (the space is
conditional on `family`, and group decomposes it into the families' subspaces), seeded
from the session's seed and the number of trials already in the study, so that a
restarted tuner asks what the first one would have; wrapped in PartialFixedSampler for
the dimensions found insensitive.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Collection, Mapping
from typing import Any

import optuna
import psycopg
import sqlalchemy
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from specops_services.tuner import space as search

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

SCHEMA = "optuna"


@functools.cache
def storage(dsn: str) -> RDBStorage:
    """Optuna's storage on `dsn`, its tables in the schema `optuna` (created by migration 012)."""

    def connect() -> psycopg.Connection[Any]:
        return psycopg.connect(dsn, options=f"-c search_path={SCHEMA}")

    return RDBStorage(
        "postgresql+psycopg://",
        engine_kwargs={"creator": connect, "poolclass": sqlalchemy.pool.QueuePool, "pool_pre_ping": True},
    )


def _load(dsn: str, session_id: str, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    return optuna.load_study(study_name=session_id, storage=storage(dsn), sampler=sampler)


def sampler_seed(seed: int, trials: int) -> int:
    """The sampler's seed for the ask after `trials` trials: reproducible across restarts."""
    return (seed * 1_000_003 + trials * 7_919) % (2**32)


def create(dsn: str, session_id: str, seeds: list[dict[str, Any]]) -> None:
    """Create the study (if missing) and enqueue the seeds into it while it is empty."""
    study = optuna.create_study(
        study_name=session_id, storage=storage(dsn), direction="maximize", load_if_exists=True
    )
    if study.get_trials(deepcopy=False):
        return
    for params in seeds:
        study.enqueue_trial(params, skip_if_exists=True)


def reconcile(dsn: str, session_id: str, known: Collection[int]) -> list[int]:
    """Tell FAIL every RUNNING trial without a tuner row; the numbers failed."""
    study = _load(dsn, session_id)
    lost = [
        t.number
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if t.number not in known
    ]
    for number in lost:
        log.warning("study %s: trial %d was asked but never committed; told FAIL", session_id, number)
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    return lost


def ask(
    dsn: str,
    session_id: str,
    space: search.Space,
    *,
    seed: int,
    dropped: Mapping[str, Any],
    known: Collection[int],
) -> tuple[int, dict[str, Any], bool]:
    """Reconcile, then ask the next trial: (number, params, whether it is an enqueued seed)."""
    reconcile(dsn, session_id, known)
    before = _load(dsn, session_id).get_trials(deepcopy=False)
    # ask() takes an enqueued (WAITING) trial first: a seed while any is left.
    seeded = any(t.state == TrialState.WAITING for t in before)
    sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
        multivariate=True, group=True, seed=sampler_seed(seed, len(before))
    )
    if dropped:
        sampler = optuna.samplers.PartialFixedSampler(dict(dropped), sampler)
    study = _load(dsn, session_id, sampler)
    trial = study.ask()
    params = search.suggest(trial, space)
    return trial.number, params, seeded


def tell(dsn: str, session_id: str, number: int, value: float | None) -> None:
    """COMPLETE with `value`, or FAIL when None; a finished trial is left as it is."""
    study = _load(dsn, session_id)
    if value is None:
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    else:
        study.tell(number, value, skip_if_finished=True)


def importances(dsn: str, session_id: str, family: str, space: search.Space) -> dict[str, float]:
    """The importances of `family`'s dimensions in the session's study (see `importances_of`)."""
    trials = _load(dsn, session_id).get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return importances_of(trials, family, space)


def importances_of(trials: list[FrozenTrial], family: str, space: search.Space) -> dict[str, float]:
    """PED-ANOVA importances of `family`'s dimensions over its complete trials ({} if too few).

    PED-ANOVA (Optuna's default evaluator) needs no scikit-learn, which fANOVA would (it is
    not installed here). The space is conditional on the family, so importances are
    computed within one family (the best trial's): over the complete trials of that family
    only, for the parameters every one of them has, less those with a single choice
    (nothing to drop).
    """
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.params.get("family") == family]
    if len(done) < 3:
        return {}
    names = set.intersection(*(set(t.params) for t in done)) - {"family"}
    names = {n for n in names if len(space.choices(n)) > 1}
    if not names:
        return {}
    local = optuna.create_study(direction="maximize")
    local.add_trials(done)
    try:
        found = get_param_importances(local, evaluator=PedAnovaImportanceEvaluator(), params=sorted(names))
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        log.info("no importances yet (%s)", exc)
        return {}
    return {name: float(value) for name, value in found.items()}


def best_params(dsn: str, session_id: str) -> dict[str, Any]:
    study = _load(dsn, session_id)
    done: list[FrozenTrial] = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        return {}
    return dict(max(done, key=lambda t: (t.value, -t.number)).params)

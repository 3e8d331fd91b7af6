"""`specops serve engine`: speccore as an OpenAI-compatible server (specops_services.engine).

The method and its settings are chosen at start, with the options of `specops generate`
(`--method`, `--k`, `--head`, `--draft`, `--datastore`, `--tree-*`), or taken from a T1/T2
run's winner with `--from-run RUN_ID`: the run (from the gateway, through the SDK) must be
completed, for the speccore engine, with a winner measured here; the winner's family, k,
tree shape and knobs are served as measured, its draft (a registry head, ...) where the
gateway's apply says it lies.

Wiring: `serve.add_parsers` adds the options (`add_engine_options`); `serve.run_serve` calls
`run` for the engine and refuses its options for the other services.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specbus.subjects import ID_PATTERN
from speccore.errors import SpecError
from specops.commands import decoding
from specops_schemas.catalog import Engine as EngineName
from specops_schemas.catalog import RunStatus
from specops_services.engine.protocol import DEFAULT_MAX_BODY_BYTES
from specplatform.settings import ENGINE_USER, load_settings
from specplatform.tenant_signature import KEY_ENV, MIN_KEY_BYTES, SIGNATURE_HEADER, TENANT_HEADER

if TYPE_CHECKING:
    from speccore.models import LoadedModel
    from speccore.proposers import ProposerConfig
    from specops.client import Run
    from specops_schemas.candidates import Candidate
    from specops_schemas.security import PolicySettings, SecurityPolicy
    from specops_services.engine.drift import DriftPolicy
    from specops_services.engine.live_workload import SummaryPolicy

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_BATCH = 32
# dest of every engine-only option: their defaults are all None (or [] for --head), so that
# `specops serve <bus service>` can tell that one was given.
ENGINE_OPTIONS = (
    "model", "device", "dtype", "threads", "method", "k", "draft", "datastore", "head", "tree_shape",
    "tree_topk", "tree_tokens", "tree_min_prob", "max_batch", "host", "port", "served_model_name",
    "from_run", "url", "token", "adaptive_k", "prefix_cache_mb", "nats_url", "draft_pool", "jitter",
    "jitter_interval_ms", "security_tier", "security_policies", "max_body_bytes", "tenant_key_file",
    "fingerprint_window", "fingerprint_every",
)  # fmt: skip
# Drift control (services/engine/drift.py): engine-only as well.
DRIFT_OPTIONS = (
    "fallback", "drift_window", "drift_threshold", "drift_recover", "drift_baseline_requests",
    "drift_probe_every", "drift_baseline", "server_id",
)  # fmt: skip
# The environment switch for --adaptive-k (issue 19's feature flag).
ADAPTIVE_K_ENV = "ENABLE_L4_ADAPTIVE_K"
# The environment switch for the live workload summaries (issue 44's feature flag).
AUTO_FINGERPRINT_ENV = "ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT"


def add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine options (specops serve engine only)")
    g.add_argument("--model", help="alias, local dir, .gguf file or Hugging Face id (default: the run's)")
    g.add_argument("--device", help="auto, cpu or cuda (default auto)")
    g.add_argument("--dtype", help="auto, float32, bfloat16 or float16 (default auto)")
    g.add_argument("--threads", type=decoding.positive, help="CPU threads for PyTorch")
    g.add_argument(
        "--method",
        type=decoding.speccore_method,
        metavar="METHOD",
        help=f"default none; {decoding.methods_help()}",
    )
    decoding.draft_args(g)
    g.add_argument(
        "--max-batch", type=decoding.positive, help=f"rows decoded together (default {DEFAULT_MAX_BATCH})"
    )
    g.add_argument("--host", help=f"address to listen on (default {DEFAULT_HOST})")
    g.add_argument("--port", type=int, help=f"port to listen on (default {DEFAULT_PORT})")
    g.add_argument("--served-model-name", help="the model's name in the API (default: --model)")
    g.add_argument(
        "--max-body-bytes",
        type=decoding.positive,
        help="a request body over this many bytes is a 413, refused before it is read "
        f"(default {DEFAULT_MAX_BODY_BYTES >> 20} MiB: a whole long context fits)",
    )
    g.add_argument("--from-run", metavar="RUN_ID", help="serve this completed T1/T2 run's measured winner")
    g.add_argument("--url", help="--from-run: gateway URL (default: SPECOPS_URL, else `specops up`'s)")
    g.add_argument("--token", help="--from-run: API token (default: SPECOPS_TOKEN, else the state dir's)")
    g.add_argument(
        "--adaptive-k",
        action="store_const",
        const=True,
        help=f"choose each step's draft size from the batch and the measured acceptance ({ADAPTIVE_K_ENV}=1)",
    )
    g.add_argument(
        "--prefix-cache-mb",
        type=decoding.positive,
        help="keep prompts' keys and values, up to this many MiB per engine and scope (one scope, or "
        "one per tenant where the policy keeps caches per tenant; the 16 most recent scopes), and "
        "skip prefilling the prefix a new prompt shares with one of them (default off)",
    )
    add_security_options(p)
    add_drift_options(p)
    add_live_workload_options(p)


def add_security_options(p: argparse.ArgumentParser) -> None:
    """Issue 20's side-channel mitigations: every tenant's default policy, and tenants' own."""
    from specops_schemas.security import JitterMode, JitterSettings, SecurityTier

    g = p.add_argument_group("security (specops serve engine only; docs/security-adr.md)")
    g.add_argument(
        "--draft-pool",
        action="store_const",
        const=True,
        help="ngram: also draft from a pool of earlier requests' prompts and outputs, shared in the "
        "single_tenant tier, per tenant in the others (F-S1); suffix always drafts from such a pool "
        "of earlier outputs (its global suffix tree)",
    )
    g.add_argument(
        "--jitter",
        choices=[m.value for m in JitterMode],
        help="F-S2 for every tenant without a policy of its own: pace releases tokens one per "
        "--jitter-interval-ms, whatever each step accepted (default off)",
    )
    g.add_argument(
        "--jitter-interval-ms",
        type=float,
        help="--jitter pace: ms between tokens, at least the plain decoding step "
        f"(default {JitterSettings().interval_ms:g})",
    )
    g.add_argument(
        "--security-tier",
        choices=[t.value for t in SecurityTier],
        help="the tier of every tenant without a policy of its own (default single_tenant)",
    )
    g.add_argument(
        "--security-policies",
        metavar="FILE",
        help="tenants' own policies: a JSON list of SecurityPolicy (the security service's); "
        "with --nats-url, policy_changed events update them",
    )
    g.add_argument(
        "--tenant-key-file",
        metavar="FILE",
        help=f"the key (at least {MIN_KEY_BYTES} bytes) shared with the trusted proxy that signs each "
        f"request's {TENANT_HEADER} claim ({SIGNATURE_HEADER}: HMAC-SHA256 over the time, endpoint, "
        f"tenant, workload and body; default: {KEY_ENV}, else none). With a key every claim must "
        "be signed; without one, only tenants of the single_tenant tier may be named "
        "(a shared or multi-tenant tier's claim is refused: 401 unsigned, 403 badly signed)",
    )


def add_drift_options(p: argparse.ArgumentParser) -> None:
    """`--fallback` turns drift control on: the primary's acceptance per (tenant, workload)."""
    from specops_services.engine.drift import FALLBACKS, DriftPolicy

    d = DriftPolicy(primary="-")
    g = p.add_argument_group("drift control (specops serve engine only; on with --fallback)")
    g.add_argument(
        "--fallback",
        choices=FALLBACKS,
        help="where a (tenant, workload) goes when the method's acceptance drifts: ngram, none (plain) "
        f"or auto (ngram while its mean acceptance length is >= {d.auto_min_mal}, else plain)",
    )
    g.add_argument(
        "--drift-window",
        type=decoding.positive,
        help=f"N: requests in the rolling window (default {d.window})",
    )
    g.add_argument(
        "--drift-threshold",
        type=float,
        help=f"drift below this x baseline acceptance (default {d.threshold})",
    )
    g.add_argument(
        "--drift-recover", type=float, help=f"recover at this x baseline on the probes (default {d.recover})"
    )
    g.add_argument(
        "--drift-baseline-requests",
        type=decoding.positive,
        help=f"W: a key's first W requests set its baseline (default {d.baseline_requests})",
    )
    g.add_argument(
        "--drift-probe-every",
        type=decoding.positive,
        help=f"M: on the fallback, every M-th request probes the method (default {d.probe_every})",
    )
    g.add_argument(
        "--drift-baseline",
        type=float,
        help="baseline acceptance for every key (default: --from-run's measured, else each key's first W)",
    )
    g.add_argument(
        "--server-id",
        help="this server's id on its events: the drift events' subject spec.serve.<id>.*, the live "
        f"workload summaries' server_id ({AUTO_FINGERPRINT_ENV}) (default HOST-PORT)",
    )
    g.add_argument(
        "--nats-url",
        help="publish drift events (and live workload summaries) on this NATS server and follow the "
        "tenants' security policy changes there (default: none; drift and summaries logged only)",
    )


def add_live_workload_options(p: argparse.ArgumentParser) -> None:
    """Each tenant's live workload summarized for the gateway's `auto` fingerprint (issue 44)."""
    from specops_services.engine.live_workload import SummaryPolicy

    d = SummaryPolicy()
    g = p.add_argument_group(
        f"live workload fingerprint (specops serve engine only; on with {AUTO_FINGERPRINT_ENV}=1)"
    )
    g.add_argument(
        "--fingerprint-window",
        type=decoding.positive,
        help=f"N: each tenant's last N requests are summarized (default {d.window})",
    )
    g.add_argument(
        "--fingerprint-every",
        type=decoding.positive,
        help=f"K: a tenant's summary is published every K of its requests (default {d.every})",
    )


def given_engine_options(args: argparse.Namespace) -> list[str]:
    """The engine-only options given on the command line, as flags."""
    given = (*ENGINE_OPTIONS, *DRIFT_OPTIONS)
    return [f"--{d.replace('_', '-')}" for d in given if getattr(args, d, None) not in (None, [])]


@dataclass(frozen=True, slots=True)
class Served:
    """What the server decodes with, chosen before anything starts."""

    method: str
    config: ProposerConfig
    model: str
    origin: str  # where the choice came from, for the log
    acceptance: float | None = None  # the run's measured acceptance (drift's baseline)


def choose(args: argparse.Namespace) -> Served:
    """The method, its ProposerConfig and the target: from the flags, or the run's winner."""
    return _from_run(args) if args.from_run else _from_flags(args)


def run(args: argparse.Namespace, served: Served) -> int:
    """Load the target, build the engine and serve until SIGTERM / SIGINT."""
    from speccore.draft_pool import DraftPools
    from speccore.engine import Engine
    from speccore.prefix_cache import PrefixCache
    from speccore.proposers import NONE, ProposerConfig, default_k, spec_of
    from specops_services.engine.app import serve
    from specops_services.engine.serving import ServerOptions

    drift = drift_policy(args, served)  # refused before the model loads
    live_workload = live_workload_policy(args)
    default_policy, policies = security_policies(args)
    tenant_key = read_tenant_key(args.tenant_key_file)
    log.info("serving %s", served.origin)
    load = argparse.Namespace(
        model=served.model, device=args.device or "auto", dtype=args.dtype or "auto", threads=args.threads
    )
    target = decoding.load_target(load)
    adaptive = adaptive_k(args)
    cross_request = served.method != NONE and spec_of(served.method).cross_request
    pools = DraftPools() if args.draft_pool or cross_request else None
    config = _builtin_datastore(target, served.config)

    def prefix_cache() -> PrefixCache | None:  # one per engine: its entries hold its own features
        return PrefixCache(max_bytes=args.prefix_cache_mb << 20) if args.prefix_cache_mb else None

    engine = Engine(
        target, served.method, config, adaptive=adaptive, draft_pools=pools, prefix_cache=prefix_cache()
    )
    engines = {engine.method: engine}
    if drift is not None:
        for method in drift.methods[1:]:
            engines[method] = Engine(
                target,
                method,
                ProposerConfig(k=default_k(method)) if method != "none" else None,
                adaptive=adaptive and method != "none",
                prefix_cache=prefix_cache(),
            )
    options = ServerOptions(
        served_model_name=args.served_model_name or served.model,
        host=args.host or DEFAULT_HOST,
        port=args.port if args.port is not None else DEFAULT_PORT,
        max_batch=args.max_batch or DEFAULT_MAX_BATCH,
        drift=drift,
        server_id=args.server_id,
        nats_url=args.nats_url,
        nats_credentials=load_settings().nats_credentials(ENGINE_USER) if args.nats_url else {},
        security=default_policy,
        policies=tuple(policies),
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        tenant_key=tenant_key,
        live_workload=live_workload,
    )
    serve(engines, options)
    return 0


def drift_policy(args: argparse.Namespace, served: Served) -> DriftPolicy | None:
    """The drift policy of the options (None without --fallback); SpecError if it cannot be."""
    from specops_services.engine.drift import DriftPolicy

    if args.server_id is not None and not re.fullmatch(ID_PATTERN, args.server_id):
        raise SpecError(f"--server-id must match {ID_PATTERN} (a subject token), got {args.server_id!r}")
    given = [f for f in given_engine_options(args) if f.removeprefix("--").replace("-", "_") in DRIFT_OPTIONS]
    if _env_flag(AUTO_FINGERPRINT_ENV):  # the live workload summaries name the server too
        given = [f for f in given if f != "--server-id"]
    if not args.fallback:
        if given:
            raise SpecError(f"{', '.join(given)}: drift control is off without --fallback")
        return None
    knobs = {
        "window": args.drift_window,
        "threshold": args.drift_threshold,
        "recover": args.drift_recover,
        "baseline_requests": args.drift_baseline_requests,
        "probe_every": args.drift_probe_every,
        "baseline": args.drift_baseline if args.drift_baseline is not None else served.acceptance,
    }
    try:
        return DriftPolicy(served.method, args.fallback, **{k: v for k, v in knobs.items() if v is not None})
    except ValueError as exc:
        raise SpecError(f"drift control: {exc}") from None


def security_policies(args: argparse.Namespace) -> tuple[PolicySettings, list[SecurityPolicy]]:
    """Every tenant's default policy (the flags) and the tenants' own (the file); SpecError if bad."""
    from pathlib import Path

    from pydantic import ValidationError

    from specops_schemas.security import JitterSettings, PolicySettings, SecurityTier
    from specops_services.engine.security import load_policies

    if args.jitter_interval_ms is not None and args.jitter != "pace":
        raise SpecError("--jitter-interval-ms paces releases: give --jitter pace with it")
    jitter = {"mode": args.jitter, "interval_ms": args.jitter_interval_ms}
    try:
        default = PolicySettings(
            tier=SecurityTier(args.security_tier or SecurityTier.SINGLE_TENANT),
            jitter=JitterSettings(**{k: v for k, v in jitter.items() if v is not None}),
        )
        policies = load_policies(Path(args.security_policies)) if args.security_policies else []
    except (ValidationError, ValueError) as exc:
        raise SpecError(f"security options: {exc}") from None
    return default, policies


def read_tenant_key(path: str | None) -> bytes | None:
    """The trusted proxy's key: the file's (surrounding whitespace dropped), else KEY_ENV's, else
    None; SpecError when it is unreadable or too short. Never a flag's value: a command line is
    readable by every user of the host (ps)."""
    from pathlib import Path

    if path is not None:
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise SpecError(f"--tenant-key-file: cannot read {path}: {exc.strerror or exc}") from None
        where = path
    elif os.environ.get(KEY_ENV):
        key, where = os.environ[KEY_ENV].strip().encode(), KEY_ENV
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise SpecError(f"the tenant key in {where} has {len(key)} bytes; it needs at least {MIN_KEY_BYTES}")
    return key


def adaptive_k(args: argparse.Namespace) -> bool:
    """--adaptive-k, or ENABLE_L4_ADAPTIVE_K=1 in the environment."""
    return bool(args.adaptive_k) or _env_flag(ADAPTIVE_K_ENV)


def live_workload_policy(args: argparse.Namespace) -> SummaryPolicy | None:
    """The live workload summaries' policy with ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT=1, else None;
    SpecError for their options without the flag."""
    from specops_services.engine.live_workload import SummaryPolicy

    knobs = {"window": args.fingerprint_window, "every": args.fingerprint_every}
    if not _env_flag(AUTO_FINGERPRINT_ENV):
        given = [f"--fingerprint-{name}" for name, value in knobs.items() if value is not None]
        if given:
            raise SpecError(
                f"{', '.join(given)}: live workload summaries are off without {AUTO_FINGERPRINT_ENV}=1"
            )
        return None
    return SummaryPolicy(**{k: v for k, v in knobs.items() if v is not None})


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _from_flags(args: argparse.Namespace) -> Served:
    if not args.model:
        raise SpecError("serve engine needs --model (or --from-run RUN_ID)")
    method = args.method or "none"
    config = decoding.proposer_config(args, method, "serve engine")
    return Served(method, config, args.model, f"{args.model} with {method} (k={config.k})")


def _from_run(args: argparse.Namespace) -> Served:
    """The method, ProposerConfig and target of a run's winner, fetched from the gateway."""
    from speccore.candidates import speccore_candidate
    from specops.client import SpecopsError, SpeculativeClient

    chosen = [f for f in given_engine_options(args) if f in _CHOSEN_BY_RUN]
    if chosen:
        raise SpecError(f"--from-run serves the run's winner as measured; drop {', '.join(chosen)}")
    try:
        with SpeculativeClient(args.url, args.token) as client:
            run = client.runs.get(args.from_run)
            candidate = served_winner(run)
            applied = client.runs.apply(run.id)
    except SpecopsError as exc:
        raise SpecError(f"cannot fetch run {args.from_run}: {exc}") from None
    model = args.model or run.request.target.model_ref
    if model != run.request.target.model_ref:
        raise SpecError(f"run {run.id} measured {run.request.target.model_ref}, not {model}; drop --model")
    spec = speccore_candidate(candidate)
    config = _with_drafts(spec.config, applied.cli_args)
    tree = list(config.tree_shape) if config.tree_shape else "-"
    origin = (
        f"run {run.id}'s winner {candidate.candidate_id} on {model} "
        f"({spec.family}, k={config.k}, tree {tree}, knobs {dict(config.knobs)})"
    )
    measured = run.winner.measurement if run.winner is not None else None
    return Served(spec.family, config, model, origin, measured.acceptance_rate if measured else None)


# What a run's winner decides, so not given beside --from-run.
_CHOSEN_BY_RUN = frozenset(
    {"--method", "--k", "--draft", "--datastore", "--head", "--tree-shape", "--tree-topk", "--tree-tokens"}
)


def served_winner(run: Run) -> Candidate:
    """The candidate `--from-run` serves; SpecError says why the run has none."""
    if run.status != RunStatus.COMPLETED:
        raise SpecError(
            f"run {run.id} is {run.status}, not completed; wait for it (`specops run` follows it)"
        )
    if run.request.target.engine != EngineName.SPECCORE:
        raise SpecError(
            f"run {run.id} chose a winner for {run.request.target.engine}, not speccore; "
            f"apply it to that engine (`POST runs/{run.id}/apply`), or start a speccore run"
        )
    if run.speculation_disabled is not None:
        raise SpecError(f"run {run.id} has no winner: {run.speculation_disabled}; serve --method none")
    if run.winner is None:
        raise SpecError(f"run {run.id} has no winner: no candidate beat plain decoding; serve --method none")
    if not run.measured or run.winner.measurement is None:
        raise SpecError(f"run {run.id}'s winner was predicted, not measured by speccore; measure it first")
    return run.winner.candidate


def _with_drafts(config: ProposerConfig, cli_args: list[str]) -> ProposerConfig:
    """``config`` with its draft source where the gateway's apply renders it (a registry head's
    directory, ...): the apply's speccore flags are `specops generate`'s, so its parser reads them."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--method")
    decoding.draft_args(parser)
    flags, _ = parser.parse_known_args(cli_args)
    return dataclasses.replace(
        config,
        head=flags.head[0] if flags.head else config.head,
        draft=flags.draft or config.draft,
        datastore=flags.datastore or config.datastore,
    )


def _builtin_datastore(target: LoadedModel, config: ProposerConfig) -> ProposerConfig:
    """A `builtin:<workload>` datastore as its file, built on first use (as `specops bench` does)."""
    from specprompts.corpora import builtin_datastore

    if config.datastore is None:
        return config
    built = builtin_datastore(target, config.datastore, "", frozenset())
    return dataclasses.replace(config, datastore=str(built)) if built is not None else config

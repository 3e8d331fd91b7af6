"""A trained EAGLE-3 head on vLLM, measured the way a T1 vLLM run measures a registry head.

The head (a `specops heads train --family eagle3` directory) is staged in a temporary
artifact store with the head-trainer's own steps (its speculators export written beside
it, then moved to its digest dir), offered by the predictor's planner to a vLLM run of
smollm2 (`plan_run`: the registry head as `registry_head` builds it from the predictor's
table), and the head candidate it picks is measured against vLLM's `none` by the
benchmark-runner's `measure_http`, launched from the flags `apply` renders — greedy, the
engine environment's server settings, a server per method. "identical" is the head's
greedy output against vLLM's `none`, prompt for prompt (its servers' token ids).

On this CPU host vLLM's CPU build runs it; on a host with a GPU and vLLM's GPU build
installed (`specops engines install vllm`), `--profile` names the GPU and the same script
measures there. Writes one JSON file::

    .venv/bin/python bench/eagle3_vllm.py --head DIR --out bench/results/eagle3-vllm-cpu2.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from common import command_of, http_rows, machine, rows_line, vllm_or_exit

from speccatalog.artifacts import HEAD_FILES, new_head_id
from speccatalog.workloads import fingerprint_of
from speccore.models import load_model
from specops_schemas.api import RunCreateRequest
from specops_schemas.candidates import Sampling
from specops_schemas.catalog import Engine
from specops_services.benchmark_runner.engine_server import HttpEngine
from specops_services.benchmark_runner.measure import Corpora
from specops_services.benchmark_runner.measure_http import measure_http
from specops_services.benchmark_runner.settings import BenchmarkRunnerSettings
from specops_services.head_trainer import logic, store
from specops_services.head_trainer.training import export_head
from specops_services.predictor.logic import registry_head
from specops_services.predictor.plan import CPU_BENCH, HostInfo, plan_run
from specplatform import engines
from specprompts.sets import load_prompts

MODEL = "smollm2-135m-instruct"
TENANT = "bench"


def stage(head: Path, root: Path) -> tuple[str, Path]:
    """The head in a store at `root` as the head-trainer leaves it: (head id, digest dir)."""
    head_id = new_head_id()
    work = store.work_dir(root, TENANT, head_id)
    work.mkdir(parents=True)
    for name in HEAD_FILES:
        shutil.copyfile(head / name, work / name)
    config = json.loads((work / "config.json").read_text())
    if config.get("family") != "eagle3":
        raise SystemExit(f"{head} is a {config.get('family')} head; only EAGLE-3 heads reach vLLM")
    config["provenance"] = (config.get("provenance") or {}) | {"head_id": head_id}
    (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    verifier = logic.speculators_verifier("eagle3", MODEL)
    if verifier is None:
        raise SystemExit(f"{MODEL} has no Hugging Face id to name as the verifier")
    target = load_model(MODEL, device="cpu", dtype="float32")
    store.write_export(work, lambda out: export_head(work, out, target, verifier))
    return head_id, store.move_to_digest_dir(root, TENANT, work)


def measure(
    args: argparse.Namespace, root: Path, head_id: str, directory: Path, workload: str
) -> dict[str, Any]:
    artifact, _ = store.describe(root, directory)
    ref = registry_head(
        head_id=head_id,
        target_ref=MODEL,
        family="eagle3",
        num_heads=artifact.num_heads,
        eagle_version=artifact.eagle_version,
        params=artifact.params,
        artifact_path=artifact.path,
        acceptance_rate=None,
        speculators_path=artifact.speculators.path if artifact.speculators else None,
    )
    if ref is None:
        raise SystemExit("the predictor maps no catalog family onto eagle3 heads")
    body = {
        "target": {"model_ref": MODEL, "gpu": args.profile, "engine": "vllm"},
        "workload": {"fingerprint": str(fingerprint_of(workload))},
    }
    host = HostInfo(cuda=args.profile != "cpu", gpu_profile=None if args.profile == "cpu" else args.profile,
                    bench=CPU_BENCH, engines=frozenset({Engine.SPECCORE, Engine.VLLM}))  # fmt: skip
    plan = plan_run(RunCreateRequest.model_validate(body), run_id=f"eagle3-vllm-{workload}", host=host,
                    available_heads=[ref])  # fmt: skip
    if plan.bench_plan is None:
        raise SystemExit(f"the planner would not measure this run here: {plan.not_measurable_reason}")
    heads = [c for c in plan.bench_plan.candidates if c.draft == head_id]
    chosen = [c.model_copy(update={"k": args.k, "candidate_id": f"eagle3-k{args.k}"}) for c in heads[:1]]
    if not chosen:
        raise SystemExit("the planner did not offer the head to the vLLM run")
    bench = plan.bench_plan.model_copy(
        update={
            "candidates": chosen,
            "reps": args.reps,
            "n_prompts": args.n_prompts,
            "max_new_tokens": args.max_new_tokens,
            "quality_gate": "topk5",  # greedy: the servers' token ids against the baseline's too
            "sampling": Sampling(temperature=0.0),  # every workload greedy (chat's own samples at 0.7)
        }
    )
    settings = BenchmarkRunnerSettings(
        threads=args.threads, bench_device="cpu" if args.profile == "cpu" else "cuda"
    )
    outcome = measure_http(
        bench,
        HttpEngine.VLLM,
        settings,
        on_rep=lambda row: print(f"  {workload} {row.candidate_id}"),
        corpora=Corpora(TENANT, root),
        prompts=load_prompts(workload, args.n_prompts, 0),
    )
    return {"offered": [c.candidate_id for c in heads], **http_rows(outcome)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, required=True, help="an EAGLE-3 head trained for smollm2")
    parser.add_argument("--out", type=Path, default=Path("bench/results/eagle3-vllm-cpu2.json"))
    parser.add_argument(
        "--profile", default="cpu", help="the run's hardware profile: cpu, or the GPU's (H200...)"
    )
    parser.add_argument("--workloads", default="chat,code")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--n-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    state = vllm_or_exit(parser)
    head_config = json.loads((args.head / "config.json").read_text())
    out: dict[str, Any] = {
        "command": command_of("bench/eagle3_vllm.py", args),
        "machine": machine(),
        "model": MODEL,
        "vllm": state.reason,
        "settings": {"greedy": True, **{k: str(v) for k, v in vars(args).items()}},
        "vllm_server_args": list(engines.VLLM.server_args),
        "head": {
            "provenance": head_config.get("provenance"),
            "draft_vocab_size": head_config.get("draft_vocab_size"),
        },
        "workloads": {},
    }
    with tempfile.TemporaryDirectory(prefix="eagle3-vllm-") as tmp:
        root = Path(tmp)
        head_id, directory = stage(args.head, root)
        for workload in args.workloads.split(","):
            started = time.monotonic()
            rows = measure(args, root, head_id, directory, workload)
            out["workloads"][workload] = rows | {"seconds": round(time.monotonic() - started, 1)}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    for workload, rows in out["workloads"].items():
        print(f"{workload:8} {rows_line(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

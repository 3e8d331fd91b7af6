"""The generation loop on the real model: what a caller gets back.

Greedy decoding through the engine is token-for-token Hugging Face's own
``generate``, independent of batch size and padding; generation stops where the
caller asked; streaming and metrics report exactly what was generated; bad
requests are refused before any work is done.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from heads import save_random_head
from transformers import GenerationConfig

from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.proposers.base import MAX_K, ProposerConfig
from speccore.sampling import SamplingParams

pytestmark = pytest.mark.slow

NEW = 32  # tokens of the batch-1 references; batch runs compare their first BATCH_NEW
BATCH_NEW = 24
# (text, chat template?) of very different lengths (4 to 43 tokens), so batches carry real padding.
PROMPTS = [
    ("The quick brown fox", False),
    ("What is 2+2? Answer with just the number.", True),  # ends its turn (EOS) after a few tokens
    ("Once upon a time, in a small village at the edge of a dark forest, there lived", False),
    ("1, 2, 3, 4, 5,", False),
]
EOS_PROMPT = 1
STORY = 2
# The model copies the list back, so n-gram drafts from the prompt are mostly right.
WONDERS = (
    "The seven wonders were the pyramid, the gardens, the statue of Zeus, the temple of Artemis, "
    "the tomb, the colossus and the lighthouse.\nThe seven wonders were the pyramid,"
)


@pytest.fixture(scope="module")
def prompts(smollm) -> list[list[int]]:
    return [smollm.encode_prompt(text, chat=chat) for text, chat in PROMPTS]


@pytest.fixture(scope="module")
def plain(smollm) -> Engine:
    return Engine(smollm, "none")


@pytest.fixture(scope="module")
def solo(plain, prompts) -> list[list[int]]:
    """Greedy tokens of every prompt generated alone (batch 1)."""
    return [plain.generate([Request(p, NEW)])[0].token_ids for p in prompts]


def test_plain_greedy_is_transformers_generate(smollm, prompts, solo) -> None:
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=2, pad_token_id=2)
    for i in (0, EOS_PROMPT, STORY):
        ids = torch.tensor([prompts[i]])
        out = smollm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        hf = out[0, ids.shape[1] :].tolist()
        expected = hf[: hf.index(2)] if 2 in hf else hf  # the engine does not return the EOS token
        assert solo[i] == expected, f"prompt {i}"


def test_generation_stops_at_eos(smollm, prompts, solo) -> None:
    ids, out = prompts[EOS_PROMPT], solo[EOS_PROMPT]
    assert 0 < len(out) < NEW
    assert not set(out) & smollm.eos_token_ids
    with torch.inference_mode():
        after = smollm.model(torch.tensor([ids + out])).logits[0, -1]
    assert int(after.argmax()) in smollm.eos_token_ids  # stopped exactly where the model ended its turn


@pytest.mark.parametrize("batch", [8, 32])
def test_padded_batch_gives_each_row_its_batch_one_tokens(plain, prompts, solo, batch: int) -> None:
    # Every prompt appears batch/4 times, each time next to different neighbours.
    order = [(3 * i + i // 4) % len(prompts) for i in range(batch)]
    results = plain.generate([Request(prompts[j], BATCH_NEW) for j in order])
    lengths = {len(prompts[j]) for j in order}
    assert max(lengths) - min(lengths) > 30  # the short rows really are padded
    for row, j in enumerate(order):
        assert results[row].token_ids == solo[j][:BATCH_NEW], f"row {row} (prompt {j})"
    assert results[order.index(EOS_PROMPT)].finish_reason == "stop"


@pytest.mark.parametrize("limit", [1, 5])
def test_max_new_tokens_is_respected(plain, prompts, solo, limit: int) -> None:
    [out] = plain.generate([Request(prompts[STORY], limit)])
    assert out.token_ids == solo[STORY][:limit]
    assert out.finish_reason == "length"
    assert out.metrics.new_tokens == limit


@pytest.fixture(scope="module")
def ngram(smollm) -> Engine:
    return Engine(smollm, "ngram", ProposerConfig(k=8))


@pytest.fixture(scope="module")
def wonders(smollm) -> list[int]:
    return smollm.encode_prompt(WONDERS, chat=False)


@pytest.fixture(scope="module")
def ngram_run(ngram, wonders):
    """30 tokens of the list-copying prompt with n-gram drafts, and the chunks streamed per step."""
    chunks: list[list[int]] = []
    [out] = ngram.generate([Request(wonders, 30)], on_tokens=lambda row, ids: chunks.append(list(ids)))
    return out, chunks


def test_speculative_steps_never_overshoot_max_new_tokens(ngram, wonders, ngram_run) -> None:
    full, _ = ngram_run
    for limit in (3, 11):
        [out] = ngram.generate([Request(wonders, limit)])
        assert out.token_ids == full.token_ids[:limit]
        assert out.finish_reason == "length"


def _assert_stopped_at(out, full_ids: list[int], stop: str, tokenizer) -> None:
    """Stopped right before the token that completes `stop`, with nothing else lost."""
    n = len(out.token_ids)
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert out.token_ids == full_ids[:n]
    assert stop in tokenizer.decode(full_ids[: n + 1], skip_special_tokens=True)


def test_stop_string_ends_plain_generation_before_it(smollm, plain, prompts, solo) -> None:
    full = solo[STORY]
    text = smollm.tokenizer.decode(full, skip_special_tokens=True)
    early = len(smollm.tokenizer.decode(full[:6], skip_special_tokens=True))
    stop = next(w for w in text.split() if len(w) >= 4 and text.find(w) > early)
    [out] = plain.generate([Request(prompts[STORY], NEW, stop=(stop,))])
    _assert_stopped_at(out, full, stop, smollm.tokenizer)
    assert len(out.token_ids) >= 6


def test_stop_string_inside_an_accepted_draft_chain(smollm, ngram, wonders, ngram_run) -> None:
    full, chunks = ngram_run
    # Two stop strings: the one that appears first in the text wins.
    [out] = ngram.generate([Request(wonders, 30, stop=(" lighthouse", " tomb"))])
    _assert_stopped_at(out, full.token_ids, " tomb", smollm.tokenizer)
    # The token completing " tomb" sits inside a multi-token step, not at its start.
    step_starts = {sum(len(c) for c in chunks[:i]) for i in range(len(chunks))}
    assert len(out.token_ids) not in step_starts


def test_streaming_delivers_exactly_the_final_tokens_in_order(smollm, ngram, wonders, prompts) -> None:
    streamed: dict[int, list[int]] = {0: [], 1: []}
    chunk_sizes: list[int] = []

    def on_tokens(row: int, ids: list[int]) -> None:
        streamed[row].extend(ids)
        chunk_sizes.append(len(ids))

    requests = [Request(wonders, 30, stop=(" tomb",)), Request(prompts[0] + wonders, 30)]
    results = ngram.generate(requests, on_tokens=on_tokens)
    assert [streamed[0], streamed[1]] == [r.token_ids for r in results]
    assert results[0].finish_reason == "stop" and results[1].finish_reason == "length"
    assert min(chunk_sizes) >= 1
    assert max(chunk_sizes) > 1  # accepted drafts arrive together, as soon as they are verified


def test_metrics_of_a_speculative_run(ngram_run) -> None:
    out, chunks = ngram_run
    m = out.metrics
    assert m.new_tokens == len(out.token_ids) == 30
    # Each verify step emits its accepted drafts plus one token from the target.
    assert m.new_tokens == m.accepted_tokens + m.verify_steps
    assert m.mean_acceptance_length == pytest.approx((m.accepted_tokens + m.verify_steps) / m.verify_steps)
    assert m.mean_acceptance_length == pytest.approx(m.new_tokens / m.verify_steps)
    assert m.mean_acceptance_length > 1.5  # the list is copied from the prompt
    assert len(chunks) == m.verify_steps
    assert 0 < m.accepted_tokens <= m.drafted_tokens
    # Chains: a draft at position i+1 is only drafted (accepted) after one at position i.
    drafted, accepted = m.drafted_per_position, m.accepted_per_position
    assert len(drafted) <= 8
    assert all(a <= d for a, d in zip(accepted, drafted, strict=True))
    assert all(x >= y for x, y in pairwise(drafted))
    assert all(x >= y for x, y in pairwise(accepted))
    assert sum(drafted) == m.drafted_tokens and sum(accepted) == m.accepted_tokens
    assert drafted[0] <= m.verify_steps


def test_metrics_of_plain_decoding(solo, plain, prompts) -> None:
    [out] = plain.generate([Request(prompts[3], 6)])
    m = out.metrics
    assert (m.new_tokens, m.verify_steps, m.drafted_tokens, m.accepted_tokens) == (6, 6, 0, 0)
    assert m.mean_acceptance_length == 1.0
    assert m.prompt_tokens == len(prompts[3])


def test_sampling_is_reproducible_per_request_seed(plain, prompts) -> None:
    hot = SamplingParams(temperature=1.0)
    reqs = [Request(prompts[STORY], 8, hot, seed=s) for s in (1, 1, 2)]
    first = [g.token_ids for g in plain.generate(reqs)]
    again = [g.token_ids for g in plain.generate(reqs[::-1])][::-1]
    assert first[0] == first[1] == again[0] == again[1]  # same seed, any row, any batch
    assert first[2] == again[2]
    assert first[2] != first[0]


# Requests refused before any work.


def test_empty_batch_and_empty_prompt_are_refused(plain, prompts) -> None:
    with pytest.raises(SpecError):
        plain.generate([])
    with pytest.raises(SpecError, match="empty"):
        plain.generate([Request(prompts[0], 4), Request([], 4)])


def test_prompt_plus_new_tokens_beyond_the_context_is_refused(smollm, plain, prompts) -> None:
    ids = prompts[0]
    with pytest.raises(SpecError, match="context"):
        plain.generate([Request(ids, smollm.max_context - len(ids) + 1)])
    with pytest.raises(SpecError):
        plain.generate([Request(ids, 0)])


def test_mixed_sampling_params_in_one_batch_are_refused(plain, prompts) -> None:
    reqs = [Request(prompts[0], 4), Request(prompts[0], 4, SamplingParams(temperature=0.7))]
    with pytest.raises(SpecError, match="sampling"):
        plain.generate(reqs)


def test_unknown_method_is_refused_with_the_known_ones(smollm) -> None:
    with pytest.raises(SpecError, match="ngram") as err:
        Engine(smollm, "medusa-9000")
    assert "none" in str(err.value)


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_learned_drafts_need_a_head(smollm, method) -> None:
    with pytest.raises(SpecError, match=f"the {method} family needs --head DIR"):
        Engine(smollm, method)


def test_head_for_another_vocabulary_is_refused(smollm, tmp_path) -> None:
    vocab = smollm.model.get_output_embeddings().weight.shape[0]
    head = save_random_head(smollm, "eagle", tmp_path / "eagle", torch.arange(64), vocab_size=vocab + 1)
    with pytest.raises(SpecError, match=f"trained for a vocabulary of {vocab + 1} tokens"):
        Engine(smollm, "eagle", ProposerConfig(head=str(head)))


def test_eagle3_feature_layer_out_of_range_is_refused(smollm, tmp_path) -> None:
    last = smollm.model.config.num_hidden_layers - 1  # its output is the final hidden state
    head = save_random_head(smollm, "eagle3", tmp_path / "eagle3", torch.arange(64), feature_layers=[2, last])
    with pytest.raises(SpecError, match=f"feature layer {last} is out of range"):
        Engine(smollm, "eagle", ProposerConfig(head=str(head)))


@pytest.mark.parametrize("k", [0, -1, MAX_K + 1])
def test_draft_length_out_of_range_is_refused(k: int) -> None:
    with pytest.raises(SpecError, match="k"):
        ProposerConfig(k=k)


def test_draft_length_limits_are_inclusive() -> None:
    assert ProposerConfig(k=1).k == 1
    assert ProposerConfig(k=MAX_K).k == MAX_K == 64

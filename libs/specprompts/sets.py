"""A workload's prompt set: which source builds it, and the set sized for one model.

``load_prompts`` picks a workload's set (``chat`` and ``code`` from
:mod:`specprompts.sources`, the six other fingerprints' from :mod:`specprompts.derived`,
``agentic`` from :mod:`specprompts.agentic`; speccatalog.workloads declares them);
``prompts_for_model`` checks that each fits a model's context and fills
``long_context`` prompts up to the model's budget. Measurement and the quality gate
both call it, so they see the same prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from speccatalog.workloads import UnknownWorkload, workload_spec
from speccore.errors import SpecError
from speccore.training.data import read_examples
from specprompts.agentic import agentic_prompts, agentic_tasks
from specprompts.code import CodeTask, code_tasks
from specprompts.derived import derived_prompts, long_context_prompts
from specprompts.sources import Prompt, chat_prompts, check_n, humaneval_prompts
from specprompts.structured import StructuredTask, structured_tasks

if TYPE_CHECKING:
    from speccore.models import LoadedModel

# prompts_for_model fills at most this many tokens, by device type: prefill cost grows
# faster than linearly with length and a bench repeats it for every method and rep.
# On this project's 2-core CPUs smollm2 took 8 s to prefill 1024 tokens, 40 s for 2048
# and 160 s for 4096 (a loaded machine), so CPU benches stop at 2048.
LONG_CONTEXT_CAP = {"cpu": 2048, "cuda": 8192}

_SOURCES: dict[str, Callable[..., list[Prompt]]] = {
    "chat": chat_prompts,
    "code": humaneval_prompts,
    "agentic": agentic_prompts,
}

# A task of the quality gate's constraint_violation: its prompt, and a check of its reply.
ConstraintTask = StructuredTask | CodeTask
# Every other workload's replies are checked on the structured-output tasks.
_CONSTRAINT_SOURCES: dict[str, Callable[[int, int], Sequence[ConstraintTask]]] = {
    "agentic": agentic_tasks,
    "code": code_tasks,
}


def load_prompts(
    workload: str, n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()
) -> list[Prompt]:
    """`n` measurement prompts for a workload, the same for the same seed.

    long_context prompts come sized for the default budget here; use
    :func:`prompts_for_model` to size them to a model's context.
    """
    check_workload(workload)
    check_n(n)
    source = _SOURCES.get(workload)
    if source is None:
        return derived_prompts(workload, n, seed, exclude_ids=exclude_ids)
    return source(n, seed, exclude_ids=exclude_ids)


def check_workload(workload: str) -> None:
    """SpecError naming the valid workloads unless `workload` is one."""
    try:
        workload_spec(workload)
    except UnknownWorkload as err:
        raise SpecError(str(err)) from None


def constraint_tasks(workload: str, n: int, seed: int = 0) -> list[ConstraintTask]:
    """`n` tasks whose replies constraint_violation checks, for a workload: the agentic set's own
    tool-session steps for ``agentic`` (an agent's code edits travel inside its JSON calls), the
    function stubs whose completions must parse for ``code``, the structured-output tasks
    (JSON Schema) for every other one."""
    check_workload(workload)
    return list(_CONSTRAINT_SOURCES.get(workload, structured_tasks)(n, seed))


def count_replies(
    tasks: Sequence[ConstraintTask], replies: Sequence[tuple[str, int]], max_new_tokens: int
) -> list[tuple[int, str | None]]:
    """(violations, first problem) of each reply, given as (text, tokens generated), to its task;
    a reply of ``max_new_tokens`` tokens was cut by the budget (code is then read as a prefix)."""
    return [
        task.count_violations(text, truncated=n >= max_new_tokens)
        for task, (text, n) in zip(tasks, replies, strict=True)
    ]


def prompts_for_model(
    target: LoadedModel,
    workload: str,
    n: int,
    *,
    max_new_tokens: int,
    seed: int = 0,
    exclude_ids: frozenset[str] = frozenset(),
    long_context_tokens: int | None = None,
) -> list[Prompt]:
    """The workload's prompts for one model, each checked to fit its context with `max_new_tokens`.

    long_context prompts are filled up to :func:`long_context_budget` tokens (or
    `long_context_tokens`, within the model's context), counted with the model's own
    tokenizer and chat template. Measurement and the quality gate both call this, so they
    see the same prompts.
    """
    room = target.max_context - max_new_tokens
    if room <= 0:
        raise SpecError(
            f"{max_new_tokens} new tokens leave no room for a prompt in {target.ref}'s context "
            f"of {target.max_context} tokens"
        )
    if workload == "long_context":
        prompts = long_context_prompts(
            n,
            seed,
            exclude_ids=exclude_ids,
            max_tokens=long_context_budget(target, max_new_tokens, long_context_tokens),
            count_tokens=lambda text: len(target.encode_user_prompt(text, True)),
        )
    else:
        prompts = load_prompts(workload, n, seed, exclude_ids=exclude_ids)
    for prompt in prompts:
        size = len(encode_for(target, prompt))
        if size > room:
            raise SpecError(
                f"prompt {prompt.id} has {size} tokens; with {max_new_tokens} new tokens it exceeds "
                f"{target.ref}'s context of {target.max_context} tokens"
            )
    return prompts


def long_context_budget(target: LoadedModel, max_new_tokens: int, cap: int | None = None) -> int:
    """Prompt tokens of a long_context prompt: the context less the new tokens, capped at `cap`,
    by default per device (LONG_CONTEXT_CAP)."""
    if cap is None:
        cap = LONG_CONTEXT_CAP.get(target.device.type, LONG_CONTEXT_CAP["cuda"])
    return min(target.max_context - max_new_tokens, cap)


def encode_for(target: LoadedModel, prompt: Prompt) -> list[int]:
    """A prompt's token ids for `target`: a chat prompt goes through its chat template if it has one."""
    return target.encode_user_prompt(prompt.text, prompt.chat)


def file_prompts(path: Path, n: int) -> list[Prompt]:
    """The first ``n`` prompts of a JSONL file of examples (the heads' data format), as chat
    prompts; each keeps the example's id, or gets ``<file name>:<index>``."""
    prompts = [
        Prompt(ex.id or f"{path.name}:{i}", ex.prompt, chat=True, source="file")
        for i, ex in islice(enumerate(read_examples(path)), n)
    ]
    if len(prompts) < n:
        raise SpecError(f"{path} holds {len(prompts)} prompts, asked for {n} (--n-prompts)")
    return prompts

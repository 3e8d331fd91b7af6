"""`constraint_violation`: JSON Schema violations per 1k generated tokens.

Each structured task asks for one JSON object and nothing else; a reply counts
one violation if it is not exactly one JSON value (prose, code fences and a reply
cut off by the token budget all count), otherwise one per schema error the
validator reports. The seed's bound "<= N violations per 1k tokens" is read as
an increase over the target's own rate on the same tasks: small models break
schemas by themselves, and speculation is only to blame for what it adds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from speccore.engine import Engine
from speccore.errors import SpecError
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference, describe


def violations(reply: str, schema: Mapping[str, Any]) -> tuple[int, str | None]:
    """(violations, first problem) of one reply against its task's schema."""
    try:
        document = json.loads(reply)
    except json.JSONDecodeError as err:
        return 1, f"not one JSON value: {err.msg}"
    validator_cls = validator_for(schema)
    try:
        validator_cls.check_schema(schema)
    except SchemaError as err:
        raise SpecError(f"structured task has an invalid JSON Schema: {err.message}") from err
    errors = list(validator_cls(schema).iter_errors(document))
    return len(errors), errors[0].message if errors else None


def per_1k(count: int, tokens: int) -> float:
    return 1000.0 * count / max(tokens, 1)


def constraint_violation(
    ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float
) -> GateOutcome:
    tasks = ref.tasks()
    chat = bool(ref.target.tokenizer.chat_template)
    ids = [ref.target.encode_prompt(t.prompt.text, chat=chat and t.prompt.chat) for t in tasks]
    n_new = ref.sample.structured_new_tokens
    base = ref.baseline("structured", ids, n_new, sampling)
    cand = ref.generate(engine, ids, n_new, sampling)

    base_found = [violations(g.text, t.schema) for g, t in zip(base, tasks, strict=True)]
    cand_found = [violations(g.text, t.schema) for g, t in zip(cand, tasks, strict=True)]
    base_count = sum(v for v, _ in base_found)
    cand_count = sum(v for v, _ in cand_found)
    base_tokens = sum(len(g.token_ids) for g in base)
    cand_tokens = sum(len(g.token_ids) for g in cand)
    base_rate, cand_rate = per_1k(base_count, base_tokens), per_1k(cand_count, cand_tokens)

    # The task where the candidate adds the most violations over the target.
    extra, worst = max(
        ((c[0] - b[0], i) for i, (b, c) in enumerate(zip(base_found, cand_found, strict=True))),
        default=(0, -1),
    )
    score = cand_rate - base_rate
    return GateOutcome(
        method=GateMethod.CONSTRAINT_VIOLATION,
        passed=score <= threshold,
        score=score,
        threshold=threshold,
        details={
            "decoding": describe(sampling),
            "tasks": len(tasks),
            "baseline_violations": base_count,
            "candidate_violations": cand_count,
            "baseline_tokens": base_tokens,
            "candidate_tokens": cand_tokens,
            "baseline_per_1k": base_rate,
            "candidate_per_1k": cand_rate,
            "candidate_valid_replies": sum(v == 0 for v, _ in cand_found),
            "worst_task": (
                {
                    "task_id": tasks[worst].prompt.id,
                    "extra_violations": extra,
                    "problem": cand_found[worst][1],
                }
                if extra > 0
                else None
            ),
        },
    )

"""Structured-output tasks: a prompt and the JSON Schema its reply must satisfy.

The ``structured`` fingerprint (JSON, tool calls, agents) is measured on these, and
the quality gate's ``constraint_violation`` method validates replies against each
task's schema. Four kinds, taken in turn while each lasts:

- tool_call: a short ShareGPT request and a few tools; the reply calls one of them
  (``oneOf`` over the offered tools, each with its argument schema).
- answer_json: an MMLU question answered as ``{"reasoning", "answer"}``.
- function_spec: a HumanEval stub described as JSON; the schema pins the function's
  name and its parameters' names in order.
- triage: an MT-Bench question classified by category, difficulty and keywords.

Schemas are JSON Schema draft 2020-12 and written into the prompt, so the model
sees the contract it is checked against. Ids are ``structured:<source id>``; the
text of a task depends only on its id.
"""

from __future__ import annotations

import ast
import functools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from speccore.errors import SpecError
from specprompts.sources import (
    MMLURow,
    Prompt,
    check_n,
    humaneval_pool,
    interleave,
    mmlu_pool,
    mtbench_categories,
    mtbench_pool,
    seeded_shuffle,
    sharegpt_pool,
)

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
KINDS = ("tool_call", "answer_json", "function_spec", "triage")
TOOL_REQUEST_CHARS = 300
TOOLS_OFFERED = 3  # plus `reply`, which fits any request

JsonSchema = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StructuredTask:
    prompt: Prompt
    schema: JsonSchema  # JSON Schema (draft 2020-12) the reply's one JSON object must satisfy
    kind: str  # one of KINDS
    check: ClassVar[Literal["json_schema"]] = "json_schema"  # what constraint_violation checks

    def count_violations(self, reply: str, truncated: bool) -> tuple[int, str | None]:
        """:func:`violations` of a reply; one cut off by the token budget is no JSON value."""
        return violations(reply, self.schema)


def violations(reply: str, schema: JsonSchema) -> tuple[int, str | None]:
    """(violations, first problem) of one reply against its task's schema: 1 when the reply is
    not exactly one JSON value (prose, code fences and a reply cut off by the token budget all
    count), otherwise one per schema error the validator reports."""
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


def structured_tasks(
    n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()
) -> list[StructuredTask]:
    """`n` tasks, the kinds in turn, the same for the same seed (prompt ids as in exclude_ids)."""
    check_n(n)
    categories = sorted(set(mtbench_categories().values()))
    sources: dict[str, tuple[Callable[[Any], StructuredTask], Sequence[Any]]] = {
        "tool_call": (_tool_call, [p for p in sharegpt_pool() if len(p.text) <= TOOL_REQUEST_CHARS]),
        "answer_json": (_answer_json, mmlu_pool()),
        "function_spec": (_function_spec, humaneval_pool()),
        "triage": (functools.partial(_triage, categories=categories), mtbench_pool()),
    }
    streams = [
        [
            (build, item)
            for item in seeded_shuffle(items, seed, f"structured:{kind}")
            if _id(item) not in exclude_ids
        ]
        for kind, (build, items) in sources.items()
    ]
    return [build(item) for build, item in interleave(streams, n, "structured")]


def _id(item: Prompt | MMLURow) -> str:
    return f"structured:{item.id}"


def _task(
    source: Prompt | MMLURow, source_name: str, kind: str, instruction: str, schema: JsonSchema
) -> StructuredTask:
    text = (
        f"{instruction}\n\nReply with one JSON object that validates against this JSON Schema, "
        f"and nothing else (no prose, no code fences):\n{json.dumps(schema)}"
    )
    return StructuredTask(Prompt(id=_id(source), text=text, chat=True, source=source_name), schema, kind)


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


# --- tool calls ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    arguments: dict[str, Any]  # JSON Schema of the arguments object


_TEXT = {"type": "string", "minLength": 1}
TOOLS = (
    Tool(
        "web_search",
        "Search the web and return the top results.",
        _object({"query": _TEXT, "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}, ["query"]),
    ),
    Tool("run_python", "Run a Python snippet and return its output.", _object({"code": _TEXT})),
    Tool(
        "send_email",
        "Send an email.",
        _object(
            {
                "to": {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$"},
                "subject": _TEXT,
                "body": {"type": "string"},
            }
        ),
    ),
    Tool(
        "create_calendar_event",
        "Add an event to the user's calendar.",
        _object(
            {
                "title": _TEXT,
                "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 1440},
            },
            ["title", "date"],
        ),
    ),
    Tool(
        "get_weather",
        "Current weather for a city.",
        _object({"city": _TEXT, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
    ),
)
REPLY_TOOL = Tool("reply", "Answer the user directly when no other tool fits.", _object({"text": _TEXT}))


def tool_call_schema(tools: Sequence[Tool]) -> JsonSchema:
    """The schema of one call of one of `tools`: ``{"name": <tool>, "arguments": {...}}``."""
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "oneOf": [
            {
                "description": tool.description,
                **_object({"name": {"const": tool.name}, "arguments": tool.arguments}),
            }
            for tool in tools
        ],
    }


def _tool_call(request: Prompt) -> StructuredTask:
    rng = random.Random(_id(request))
    tools = [*rng.sample(TOOLS, TOOLS_OFFERED), REPLY_TOOL]
    schema = tool_call_schema(tools)
    instruction = (
        f"You are an agent with these tools: {', '.join(t.name for t in tools)}. Call the most suitable "
        f"tool for the user's request below.\n\nUser request: {request.text}"
    )
    return _task(request, "sharegpt", "tool_call", instruction, schema)


# --- answers, descriptions, classifications -------------------------------------------


def _answer_json(q: MMLURow) -> StructuredTask:
    options = "\n".join(f"{letter}) {choice}" for letter, choice in zip("ABCD", q.choices, strict=True))
    schema = {
        "$schema": JSON_SCHEMA_DIALECT,
        **_object(
            {
                "reasoning": {"type": "string", "minLength": 1, "maxLength": 600},
                "answer": {"enum": ["A", "B", "C", "D"]},
            }
        ),
    }
    instruction = (
        f"Answer this multiple-choice question about {q.subject}: explain briefly in `reasoning`, "
        f"then give the letter in `answer`.\n\n{q.question}\n{options}"
    )
    return _task(q, "mmlu", "answer_json", instruction, schema)


def _function_spec(stub: Prompt) -> StructuredTask:
    function = [node for node in ast.parse(stub.text).body if isinstance(node, ast.FunctionDef)][-1]
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    parameter = {"type": "object", "properties": {"type": _TEXT}, "required": ["name", "type"]}
    parameters: dict[str, Any] = {"type": "array", "minItems": len(names), "maxItems": len(names)}
    if names:  # prefixItems may not be empty
        parameters["prefixItems"] = [
            {
                **parameter,
                "properties": {"name": {"const": name}, "type": _TEXT},
                "additionalProperties": False,
            }
            for name in names
        ]
    schema = {
        "$schema": JSON_SCHEMA_DIALECT,
        **_object(
            {
                "name": {"const": function.name},
                "parameters": parameters,
                "returns": _TEXT,
                "summary": {"type": "string", "minLength": 1, "maxLength": 300},
            }
        ),
    }
    instruction = (
        "Describe the Python function below as JSON: its name, each parameter's name and type in "
        "order, its return type and a one-sentence summary.\n\n```python\n" + stub.text + "```"
    )
    return _task(stub, "humaneval", "function_spec", instruction, schema)


def _triage(question: Prompt, categories: list[str]) -> StructuredTask:
    schema = {
        "$schema": JSON_SCHEMA_DIALECT,
        **_object(
            {
                "category": {"enum": categories},
                "difficulty": {"enum": ["easy", "medium", "hard"]},
                "needs_code": {"type": "boolean"},
                "keywords": {
                    "type": "array",
                    "items": _TEXT,
                    "minItems": 1,
                    "maxItems": 5,
                    "uniqueItems": True,
                },
            }
        ),
    }
    instruction = (
        "Triage the request below for a help desk: pick its category, rate its difficulty, say "
        f"whether answering needs code, and list up to five keywords.\n\nRequest: {question.text}"
    )
    return _task(question, "mtbench", "triage", instruction, schema)

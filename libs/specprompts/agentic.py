"""The ``agentic`` prompt set: repetitive traffic of agents, measured as ``structured``.

An agent's requests repeat themselves: one system prompt and one tool schema for
every call, each step of a loop carries what the previous step produced, and a failed
task is tried again. Three kinds of session, built from the packaged data and taken in
turn:

- tool session: TOOL_SESSION_STEPS ShareGPT requests to one agent whose tools
  (:data:`specprompts.structured.TOOLS` and ``reply``) are the same in every prompt; a
  raw transcript (no chat template) whose step j shows the session so far (the earlier
  requests, each answered by a ``reply`` call carrying the real ShareGPT answer,
  shortened) and ends where the next call begins. Every call is one JSON object of one
  schema, so replies are checkable as the ``structured`` tasks are (:func:`agentic_tasks`).
- code-edit loop: a HumanEval function (stub and canonical solution) edited in
  CODE_EDIT_STEPS steps (rename a variable, rename the function, shorten the
  docstring); step j shows the file as the steps before it left it and asks for the
  whole file back, so a reply rewrites most of its prompt.

- retry: a HumanEval task attempted RETRY_ATTEMPTS times, each attempt in a fresh
  context (pass@k, rollouts, an orchestrator re-dispatching a failed sub-task): attempt
  j shows the task and, after the first, one of HumanEval's checks as the failure an
  earlier attempt met — never an earlier attempt's code, so what repeats is the
  agent's own output across requests, which only a cross-request draft source sees.

Order is a session's: steps in turn, sessions in a seeded order, the three kinds
taken in turn (three agents of one tenant), so an earlier request's output resembles
later ones. A prompt's text depends only on its id: ``agentic:<sharegpt id>`` for a
tool-session step (sessions are fixed runs of the request pool, in file order),
``agentic:<humaneval id>/edit<j>`` for a code-edit step and
``agentic:<humaneval id>/attempt<j>`` for a retry.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import json
import random
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specprompts.derived import Document, documents
from specprompts.sources import Prompt, check_n, humaneval_problems, interleave, seeded_shuffle
from specprompts.structured import REPLY_TOOL, TOOLS, StructuredTask, tool_call_schema

TOOL_SESSION_STEPS = 4
TOOL_REQUEST_CHARS = 300
HISTORY_ANSWER_CHARS = 240  # a shortened earlier answer in a session's history
CODE_EDIT_STEPS = 3
RETRY_ATTEMPTS = 3
KIND_TOOL = "tool_session"
KIND_CODE = "code_edit"
KIND_RETRY = "retry"
KINDS = (KIND_TOOL, KIND_CODE, KIND_RETRY)  # in the order the set takes them

AGENT_SCHEMA = tool_call_schema([*TOOLS, REPLY_TOOL])
AGENT_SYSTEM = (
    "A transcript of an agent that acts only through tools. Its tools, each with the JSON Schema of "
    "its arguments:\n"
    + "".join(f"- {t.name}: {t.description} {json.dumps(t.arguments)}\n" for t in (*TOOLS, REPLY_TOOL))
    + 'Each answer of the assistant is one JSON object, {"name": <tool>, "arguments": {...}}, and '
    "nothing else.\n\nExample:\n"
    "User: What's the weather in Lisbon right now, in celsius?\n"
    'Assistant: {"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}'
)
CODE_AGENT_SYSTEM = (
    "You are a coding agent. You edit one Python file step by step; after each step the file is "
    "saved and the next step starts from it."
)
RETRY_SYSTEM = "You are a coding agent. Every attempt at a task starts from a fresh context."

# New names for renamed variables, taken in turn (skipping any the file already uses).
_NEW_NAMES = (
    "value", "items", "result", "total", "count", "index", "current", "best", "seen", "text",
    "number", "values", "acc", "chars", "words", "limit", "pair", "step", "left", "right",
)  # fmt: skip
_FUNCTION_SUFFIXES = ("_impl", "_v2", "_checked", "_fast", "_safe")
# A sentence's end: not the period of a list item's number ("2. ").
_SENTENCE_END = re.compile(r"(?<![0-9])[.!?](\s|$)")
_EDIT_ID = re.compile(r"/edit\d+$")
_ATTEMPT_ID = re.compile(r"/attempt\d+$")
# Where a docstring's summary ends at the latest: a blank line or the first example.
_DOC_BREAK = re.compile(r"\n\s*\n|>>>|\b(?:For example|Examples?)\b")


def agentic_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """`n` prompts: tool-session steps, code-edit steps and retries in turn, each kind in
    session order."""
    check_n(n)
    streams: list[list[tuple[Callable[[Any], Prompt], _ToolStep | _EditStep | _Attempt]]] = [
        [(_tool_prompt, step) for step in _tool_steps(seed, exclude_ids)],
        [(_edit_step, step) for step in _edit_steps(seed, exclude_ids)],
        [(_attempt_prompt, attempt) for attempt in _attempts(seed, exclude_ids)],
    ]
    return [build(step) for build, step in interleave(streams, n, "agentic")]


def kind_of(prompt_id: str) -> str:
    """The kind of session an agentic prompt belongs to (KIND_TOOL, KIND_CODE or KIND_RETRY)."""
    if _EDIT_ID.search(prompt_id):
        return KIND_CODE
    return KIND_RETRY if _ATTEMPT_ID.search(prompt_id) else KIND_TOOL


def agentic_tasks(
    n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()
) -> list[StructuredTask]:
    """The set's first `n` tool-session steps, each with the agent's call schema (the checkable ones)."""
    check_n(n)
    return [_tool_step(step) for step in interleave([_tool_steps(seed, exclude_ids)], n, "agentic")]


# --- tool sessions -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ToolStep:
    session: tuple[Document, ...]
    step: int  # index of the current request in session

    @property
    def id(self) -> str:
        return f"agentic:{self.session[self.step].id}"


@functools.cache
def _tool_sessions() -> tuple[tuple[Document, ...], ...]:
    """Fixed runs of TOOL_SESSION_STEPS short requests, in the documents' file order."""
    pool = [d for d in documents() if len(d.question) <= TOOL_REQUEST_CHARS]
    size = TOOL_SESSION_STEPS
    return tuple(tuple(pool[i : i + size]) for i in range(0, len(pool) - size + 1, size))


def _tool_steps(seed: int, exclude_ids: frozenset[str]) -> list[_ToolStep]:
    steps = (
        _ToolStep(session, j)
        for session in seeded_shuffle(_tool_sessions(), seed, "agentic:tools")
        for j in range(len(session))
    )
    return [s for s in steps if s.id not in exclude_ids]


def _tool_step(step: _ToolStep) -> StructuredTask:
    turns = [
        f"User: {doc.question}\nAssistant: {_reply_call(doc.answer)}" for doc in step.session[: step.step]
    ]
    history = "Session so far:\n" + "\n\n".join(turns) + "\n\n" if turns else ""
    text = f"{AGENT_SYSTEM}\n\n{history}User: {step.session[step.step].question}\nAssistant:"
    # A transcript to continue, as completion-style agents prompt: a chat template around it
    # made the small models here answer in prose or repeat the example, not call a tool.
    prompt = Prompt(id=step.id, text=text, chat=False, source="sharegpt")
    return StructuredTask(prompt, AGENT_SCHEMA, KIND_TOOL)


def _tool_prompt(step: _ToolStep) -> Prompt:
    return _tool_step(step).prompt


def _reply_call(answer: str) -> str:
    return json.dumps({"name": REPLY_TOOL.name, "arguments": {"text": shorten(answer, HISTORY_ANSWER_CHARS)}})


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to at most `limit` characters: after its last whole sentence
    that fits, or at a word with "..." when no sentence fits."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    ends = [m.start() + 1 for m in _SENTENCE_END.finditer(flat, 0, limit)]
    if ends:
        return flat[: ends[-1]]
    return flat[: limit - 3].rsplit(" ", 1)[0] + "..."


# --- code-edit loops -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Edit:
    kind: str  # "variable" | "function" | "docstring"
    old: str = ""  # the name renamed
    new: str = ""  # its new name


@dataclass(frozen=True, slots=True)
class _EditStep:
    source_id: str  # "humaneval:HumanEval/<i>"
    step: int  # index into the loop's edits

    @property
    def id(self) -> str:
        return f"agentic:{self.source_id}/edit{self.step + 1}"


@dataclass(frozen=True, slots=True)
class _Loop:
    code: str  # the file before the first edit: the stub and its canonical solution
    entry: str  # the function the edits change
    edits: tuple[_Edit, ...]


@functools.cache
def _loops() -> dict[str, _Loop]:
    loops: dict[str, _Loop] = {}
    for task_id, problem in humaneval_problems().items():
        source_id = f"humaneval:{task_id}"
        code = problem["prompt"] + problem["canonical_solution"]
        loops[source_id] = _plan(source_id, code, problem["entry_point"])
    return loops


def _edit_steps(seed: int, exclude_ids: frozenset[str]) -> list[_EditStep]:
    loops = _loops()
    steps = (
        _EditStep(source_id, j)
        for source_id in seeded_shuffle(sorted(loops), seed, "agentic:edits")
        for j in range(len(loops[source_id].edits))
    )
    return [s for s in steps if s.id not in exclude_ids]


def _edit_step(step: _EditStep) -> Prompt:
    loop = _loops()[step.source_id]
    code, entry = loop.code, loop.entry
    for edit in loop.edits[: step.step]:
        code, entry = apply_edit(code, entry, edit)
    text = (
        f"{CODE_AGENT_SYSTEM}\n\nCurrent file:\n```python\n{code}```\n\n"
        f"Step {step.step + 1} of {len(loop.edits)}: {_instruction(loop.edits[step.step], entry)} "
        "Change nothing else. Reply with the complete updated file in one ```python code block and "
        "nothing else."
    )
    return Prompt(id=step.id, text=text, chat=True, source="humaneval")


def _instruction(edit: _Edit, entry: str) -> str:
    if edit.kind == "variable":
        return f"in `{entry}`, rename `{edit.old}` to `{edit.new}` everywhere it is used."
    if edit.kind == "function":
        return f"rename the function `{edit.old}` to `{edit.new}`, in its docstring examples too."
    return f"shorten the docstring of `{entry}` to its first sentence, on one line."


def _plan(source_id: str, code: str, entry: str) -> _Loop:
    """Up to CODE_EDIT_STEPS edits of `entry`, chosen and ordered by a Random seeded by the id."""
    rng = random.Random(f"agentic:{source_id}")
    function = _function(code, entry)
    taken = _names(code)
    fresh = [name for name in _NEW_NAMES if name not in taken]
    variables = [v for v in _renamable(code, function) if v != entry]
    rng.shuffle(variables)
    edits = [_Edit("variable", old, new) for old, new in zip(variables[:2], fresh, strict=False)]
    edits.append(_Edit("function", entry, entry + rng.choice(_FUNCTION_SUFFIXES)))
    if _docstring(function) is not None:
        edits.append(_Edit("docstring"))
    rng.shuffle(edits)
    return _Loop(code, entry, tuple(edits[:CODE_EDIT_STEPS]))


def apply_edit(code: str, entry: str, edit: _Edit) -> tuple[str, str]:
    """The file after one edit, and the edited function's name after it."""
    if edit.kind == "function":
        # Its definition and every call, in code and in docstring examples, not the word in prose.
        return re.sub(rf"\b{re.escape(edit.old)}(?=\()", edit.new, code), edit.new
    function = _function(code, entry)
    if edit.kind == "variable":
        return _rename(code, function, edit.old, edit.new), entry
    docstring = _docstring(function)
    if docstring is None:
        return code, entry
    lines = code.splitlines(keepends=True)
    indent = lines[docstring.lineno - 1][: docstring.col_offset]
    summary = _first_sentence(ast.get_docstring(function) or "")
    lines[docstring.lineno - 1 : docstring.end_lineno] = [f'{indent}"""{summary}"""\n']
    return "".join(lines), entry


# --- retries ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Attempt:
    source_id: str  # "humaneval:HumanEval/<i>"
    attempt: int  # 0 for the first

    @property
    def id(self) -> str:
        return f"agentic:{self.source_id}/attempt{self.attempt + 1}"


@functools.cache
def _retry_tasks() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per HumanEval task with enough checks: its stub and the checks shown as failures."""
    tasks: dict[str, tuple[str, tuple[str, ...]]] = {}
    for task_id, problem in humaneval_problems().items():
        checks = _checks(problem["test"])
        if len(checks) >= RETRY_ATTEMPTS - 1:
            tasks[f"humaneval:{task_id}"] = (problem["prompt"], tuple(checks[: RETRY_ATTEMPTS - 1]))
    return tasks


def _checks(test: str) -> list[str]:
    """The asserts of a HumanEval test's ``check`` that call the candidate, each on one line."""
    check = next(n for n in ast.parse(test).body if isinstance(n, ast.FunctionDef) and n.name == "check")
    return [
        " ".join((ast.get_source_segment(test, node) or "").split())
        for node in check.body
        if isinstance(node, ast.Assert)
        and any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node.test))
    ]


def _attempts(seed: int, exclude_ids: frozenset[str]) -> list[_Attempt]:
    attempts = (
        _Attempt(source_id, j)
        for source_id in seeded_shuffle(sorted(_retry_tasks()), seed, "agentic:retries")
        for j in range(RETRY_ATTEMPTS)
    )
    return [a for a in attempts if a.id not in exclude_ids]


def _attempt_prompt(attempt: _Attempt) -> Prompt:
    stub, checks = _retry_tasks()[attempt.source_id]
    feedback = (
        f"Attempt {attempt.attempt + 1} of {RETRY_ATTEMPTS}. An earlier attempt failed this check:\n"
        f"{checks[attempt.attempt - 1]}\n\n"
        if attempt.attempt
        else ""
    )
    text = (
        f"{RETRY_SYSTEM}\n\nTask: complete this function.\n```python\n{stub}```\n\n"
        f"{feedback}Reply with the complete function in one ```python code block and nothing else."
    )
    return Prompt(id=attempt.id, text=text, chat=True, source="humaneval")


def _function(code: str, entry: str) -> ast.FunctionDef:
    return next(
        node for node in ast.parse(code).body if isinstance(node, ast.FunctionDef) and node.name == entry
    )


def _docstring(function: ast.FunctionDef) -> ast.Expr | None:
    first = function.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        return None
    return first if isinstance(first.value.value, str) else None


def _first_sentence(docstring: str) -> str:
    """The first sentence of the docstring's first paragraph (before any example), or that
    paragraph's first line; with no quote at its end, which would close the docstring early."""
    paragraph = _DOC_BREAK.split(docstring.strip(), maxsplit=1)[0]
    text = " ".join(paragraph.split())
    match = _SENTENCE_END.search(text)
    summary = text[: match.start() + 1] if match else " ".join(paragraph.splitlines()[0].split())
    return summary.replace('"""', "'''").rstrip('"\\ ')


def _names(code: str) -> set[str]:
    return {t.string for t in _tokens(code) if t.type == tokenize.NAME}


def _tokens(code: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(code).readline))


def _renamable(code: str, function: ast.FunctionDef) -> list[str]:
    """The function's parameters and local variables that a token-wise rename renames whole:
    no builtins, and none that an f-string of the function mentions (its text is one token)."""
    args = function.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    stored = [n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    fstrings = " ".join(
        t.string
        for t in _tokens(code)
        if t.type == tokenize.STRING
        and function.lineno <= t.start[0] <= (function.end_lineno or t.start[0])
        and t.string.lstrip("rRbBuU").lower().startswith("f")
    )
    names = dict.fromkeys([*params, *stored])
    return [
        name
        for name in names
        if not hasattr(builtins, name) and not re.search(rf"\b{re.escape(name)}\b", fstrings)
    ]


def _rename(code: str, function: ast.FunctionDef, old: str, new: str) -> str:
    """`old` renamed to `new` wherever it is a name (not an attribute) inside `function`."""
    lines = code.splitlines(keepends=True)
    tokens = _tokens(code)
    end = function.end_lineno or function.lineno
    hits = [
        t.start
        for i, t in enumerate(tokens)
        if t.type == tokenize.NAME
        and t.string == old
        and function.lineno <= t.start[0] <= end
        and not (i and tokens[i - 1].string == ".")
    ]
    for row, col in reversed(hits):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old) :]
    return "".join(lines)

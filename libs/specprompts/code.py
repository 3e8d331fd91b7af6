"""Code tasks: a HumanEval function stub whose completion must be Python that parses.

The ``code`` fingerprint (code completion) is gated on these by ``constraint_violation``:
the same stubs the ``code`` workload measures on (specprompts.sources.humaneval_prompts),
completed as raw prompts, and each completion checked by Python's own compiler (never
run). Glossary:

- *completion*: the text the model generated after the stub (signature + docstring).
- *function end*: the first line of the completion that starts, at column 0, with one of
  :data:`FUNCTION_END` (HumanEval's stop sequences ``def``, ``class``, ``if``, ``print``,
  ``#``). A completion client stops there, so nothing after it is checked. Any other
  line at column 0 (a Markdown fence, prose) is kept: in a code completion it breaks the
  file, and counts.
- *finished*: the completion reached its function end, or the model stopped (end of
  sequence) before the token budget. The stub plus the completion up to the function
  end must then compile.
- *truncated*: the budget ran out before either. Its last line may be cut inside a
  token (``0x`` of ``0x1F``), so it is dropped, and the stub plus the complete lines
  before it must be a valid *prefix* of a program: complete, or incomplete input only
  (an open bracket, string or block that later lines could close), as Python's
  ``codeop`` tells them apart. A line that no continuation can repair counts.

A completion that fails counts as one violation (per task, however many errors). The
shipped code set is Python; Python's compiler is the language's definition, where an
error-tolerant parser (tree-sitter) would be an approximation, so no other parser is
used. Ids are ``humaneval:<task id>``, as the workload's prompts.
"""

from __future__ import annotations

import codeop
import re
import warnings
from dataclasses import dataclass
from typing import ClassVar, Literal

from specprompts.sources import Prompt, humaneval_prompts

# Lines at column 0 that end the completed function (HumanEval's stop sequences).
FUNCTION_END = ("def", "class", "if", "print", "#")
_END_LINE = re.compile("^(?:" + "|".join(map(re.escape, FUNCTION_END)) + ")", re.M)


@dataclass(frozen=True, slots=True)
class CodeTask:
    prompt: Prompt  # a raw completion prompt: the function's signature and docstring
    check: ClassVar[Literal["python_syntax"]] = "python_syntax"  # what constraint_violation checks

    def count_violations(self, reply: str, truncated: bool) -> tuple[int, str | None]:
        """(0 or 1, the problem) of one completion; ``truncated``: the token budget ended it."""
        problem = completion_problem(self.prompt.text, reply, truncated=truncated)
        return int(problem is not None), problem


def code_tasks(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[CodeTask]:
    """`n` function stubs to complete, the same for the same seed (the ``code`` workload's)."""
    return [CodeTask(p) for p in humaneval_prompts(n, seed, exclude_ids=exclude_ids)]


def function_end(completion: str) -> int | None:
    """The offset of the completion's function end (module docstring); None if it has none."""
    found = _END_LINE.search(completion)
    return found.start() if found is not None else None


def completion_problem(stub: str, completion: str, *, truncated: bool) -> str | None:
    """Why ``stub + completion`` is not Python by the module's rule; None when it is."""
    end = function_end(completion)
    if end is not None:
        return _compile_problem(stub, completion[:end], prefix=False)
    if not truncated:
        return _compile_problem(stub, completion, prefix=False)
    complete_lines = completion[: completion.rfind("\n") + 1]
    return _compile_problem(stub, complete_lines, prefix=True)


def _compile_problem(stub: str, completion: str, *, prefix: bool) -> str | None:
    source = stub + completion
    # The compiler warns about questionable code (invalid escapes) that still compiles.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if prefix:
                codeop.compile_command(source, "<completion>", "exec")
            else:
                compile(source, "<completion>", "exec", dont_inherit=True)
        except SyntaxError as err:
            line = (err.lineno or 0) - stub.count("\n")
            return f"completion line {line}: {err.msg}" if line > 0 else err.msg
        except ValueError as err:  # a null byte in the source
            return str(err)
    return None

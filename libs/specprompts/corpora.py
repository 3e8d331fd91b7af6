"""Default REST datastores built from corpora that ship with this machine.

code: the Python standard library's sources. chat: ShareGPT assistant replies,
leaving out the conversations whose prompts are being measured.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

from speccore.datastore import build_datastore, vocab_fingerprint
from speccore.errors import SpecError
from speccore.models import LoadedModel, cache_root
from specprompts.sources import sharegpt_conversations

# A datastore ref naming a default datastore rather than a file: "builtin:<workload>".
BUILTIN_PREFIX = "builtin:"
CHAT_CONVERSATIONS = 4000
# The interpreter's own sources, without installed packages and test suites.
STDLIB_EXCLUDE = ("site-packages", "test", "tests", "idle_test", "lib2to3")


def default_datastore(target: LoadedModel, workload: str, exclude_ids: frozenset[str]) -> Path:
    """Path of the workload's datastore for this tokenizer, built on first use."""
    if workload not in ("chat", "code"):
        raise SpecError(f"no default REST corpus for workload '{workload}'; pass --datastore")
    key = hashlib.sha256(
        "\n".join([workload, vocab_fingerprint(target.tokenizer), *sorted(exclude_ids)]).encode()
    ).hexdigest()[:16]
    out = cache_root() / "datastores" / f"{workload}-{key}.npz"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if workload == "code":
        build_datastore(
            target.tokenizer,
            Path(sysconfig.get_paths()["stdlib"]),
            out,
            pattern="*.py",
            exclude=STDLIB_EXCLUDE,
        )
        return out
    corpus = out.with_suffix(".jsonl")
    with corpus.open("w") as fh:
        for _, turns in sharegpt_conversations(CHAT_CONVERSATIONS, exclude_ids=exclude_ids):
            for role, text in turns:
                if role == "assistant":
                    fh.write(json.dumps({"text": text}) + "\n")
    build_datastore(target.tokenizer, corpus, out)
    corpus.unlink()
    return out


def builtin_datastore(
    target: LoadedModel, ref: str | None, workload: str, exclude_ids: frozenset[str]
) -> Path | None:
    """The file of a built-in datastore ref: ``builtin:<workload>``, or None for the measured
    workload's own; None when ``ref`` names a datastore file instead. Services that
    measure and gate one candidate resolve it here, so both use the same file."""
    name = ref or f"{BUILTIN_PREFIX}{workload}"
    if not name.startswith(BUILTIN_PREFIX):
        return None
    return default_datastore(target, name.removeprefix(BUILTIN_PREFIX), exclude_ids)

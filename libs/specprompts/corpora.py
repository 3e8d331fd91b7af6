"""REST datastores of a candidate's draft: the defaults built from corpora that ship with
this machine, and the corpora tenants uploaded (`POST datastores`).

A workload's spec (speccatalog.workloads) names the corpus of its default datastore, if
it has one: ``stdlib``, the Python standard library's sources (code); ``sharegpt``,
ShareGPT assistant replies, leaving out the conversations whose prompts are being
measured (chat). An uploaded corpus
(``ds-<hex>``, speccatalog.artifacts) is found in its tenant's part of the artifact
store and indexed with the measuring target's tokenizer on first use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sysconfig
import time
from pathlib import Path

from speccatalog.artifacts import find_corpus, is_datastore_id
from speccatalog.workloads import WORKLOADS
from speccore.datastore import build_datastore, vocab_fingerprint
from speccore.errors import SpecError
from speccore.models import LoadedModel, cache_root
from specprompts.sources import sharegpt_conversations

log = logging.getLogger(__name__)

# A datastore ref naming a default datastore rather than a file: "builtin:<workload>".
BUILTIN_PREFIX = "builtin:"
CHAT_CONVERSATIONS = 4000
# The interpreter's own sources, without installed packages and test suites.
STDLIB_EXCLUDE = ("site-packages", "test", "tests", "idle_test", "lib2to3")


def default_datastore(target: LoadedModel, workload: str, exclude_ids: frozenset[str]) -> Path:
    """Path of the workload's datastore for this tokenizer, built on first use."""
    spec = WORKLOADS.get(workload)
    if spec is None or spec.corpus is None:
        raise SpecError(f"no default REST corpus for workload '{workload}'; pass --datastore")
    key = hashlib.sha256(
        "\n".join([workload, vocab_fingerprint(target.tokenizer), *sorted(exclude_ids)]).encode()
    ).hexdigest()[:16]
    out = cache_root() / "datastores" / f"{workload}-{key}.npz"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if spec.corpus == "stdlib":
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


def uploaded_datastore(target: LoadedModel, corpus: Path) -> Path:
    """The datastore of an uploaded corpus file for this tokenizer, built on first use.

    Cached by the corpus's sha256 (its file name in the artifact store) and the
    tokenizer's vocabulary, so every tenant's copy of one corpus is indexed once per
    tokenizer; a text corpus is one document, as it was uploaded.
    """
    vocab = vocab_fingerprint(target.tokenizer)
    out = cache_root() / "datastores" / f"upload-{corpus.stem[:16]}-{vocab[:16]}.npz"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info(
        "indexing corpus %s (%d bytes) with %s's tokenizer ...",
        corpus.name,
        corpus.stat().st_size,
        getattr(target.tokenizer, "name_or_path", "the target"),
    )
    started = time.perf_counter()
    store = build_datastore(target.tokenizer, corpus, out, paragraphs=False, progress=False)
    log.info(
        "datastore %s: %d docs, %d tokens in %.1fs",
        out.name,
        store.meta["n_docs"],
        store.meta["n_tokens"],
        time.perf_counter() - started,
    )
    return out


def candidate_datastore(
    target: LoadedModel,
    ref: str | None,
    workload: str,
    exclude_ids: frozenset[str],
    *,
    tenant_id: str | None = None,
    artifact_root: Path | None = None,
) -> Path | None:
    """The datastore file a rest candidate's draft names: a built-in one (builtin_datastore),
    the tenant's uploaded corpus (``ds-<hex>``) indexed for this target, or None when ``ref``
    is a datastore file already. SpecError when an uploaded corpus is not in the tenant's
    part of the artifact store."""
    if is_datastore_id(ref):
        if tenant_id is None or artifact_root is None:
            raise SpecError(f"datastore {ref} is an uploaded corpus, and no artifact store is known here")
        corpus = find_corpus(artifact_root, tenant_id, str(ref))
        if corpus is None:
            raise SpecError(
                f"datastore {ref} has no corpus in tenant {tenant_id}'s artifact store "
                f"({artifact_root}); upload it with `specops datastores upload`, or set "
                "SPECOPS_ARTIFACT_DIR to the gateway's store"
            )
        return uploaded_datastore(target, corpus)
    return builtin_datastore(target, ref, workload, exclude_ids)

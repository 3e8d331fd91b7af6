"""The REST datastore (suffix array, lookups, corpus formats) and the rest proposer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import AutoTokenizer

from speccatalog.families import family
from speccatalog.families.base import FamilyError, Known
from speccatalog.targets import DatastoreRef, resolve_target
from speccore.datastore import SEPARATOR, Datastore, build_datastore, suffix_array, vocab_fingerprint
from speccore.errors import SpecError
from speccore.models import resolve_alias
from speccore.proposers import make_proposer
from speccore.proposers.base import ProposerConfig, StepContext
from speccore.proposers.rest import best_subtree
from speccore.sampling import SamplingParams
from speccore.state import Sequence

CODE = '''def add(a, b):
    """Return the sum."""
    return a + b


def mul(a, b):
    """Return the product."""
    return a * b
'''


@pytest.fixture(scope="session")
def tokenizer_dir(pytestconfig, tmp_path_factory) -> Path:
    """The smollm2 tokenizer saved as tokenizer.json: reading the GGUF takes ~10 s, this ~0.5 s."""
    cache = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    saved = cache.mkdir("smollm2-tokenizer") if cache is not None else tmp_path_factory.mktemp("tok")
    if not (saved / "tokenizer.json").is_file():
        gguf = Path(resolve_alias("smollm2-135m-instruct"))
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.save_pretrained(saved)
    return saved


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def random_tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    tokens = rng.integers(0, vocab, n).astype(np.int32)
    tokens[rng.random(n) < 0.08] = SEPARATOR
    return np.append(tokens, np.int32(SEPARATOR))


def store_of(tokens: np.ndarray) -> Datastore:
    return Datastore(tokens, suffix_array(tokens), "test", {"format_version": 1})


def test_suffix_array_matches_brute_force_sort():
    rng = np.random.default_rng(0)
    for _ in range(50):
        tokens = random_tokens(rng, int(rng.integers(1, 300)), int(rng.integers(1, 5)))
        # Each separator is its own symbol below every token, ordered by position.
        keys = [(0, i) if t == SEPARATOR else (1, int(t)) for i, t in enumerate(tokens)]
        expected = sorted(range(len(tokens)), key=lambda i: keys[i:])
        assert suffix_array(tokens).tolist() == expected


def brute_continuations(tokens, context, max_suffix, min_suffix, depth):
    seq = tokens.tolist()
    for m in range(min(max_suffix, len(context)), min_suffix - 1, -1):
        query = list(context[len(context) - m :])
        starts = [i for i in range(len(seq) - m + 1) if seq[i : i + m] == query]
        if not starts:
            continue
        counts: Counter[tuple[int, ...]] = Counter()
        for s in starts:
            follow = seq[s + m : s + m + depth]
            follow = follow[: follow.index(SEPARATOR)] if SEPARATOR in follow else follow
            if follow:
                counts[tuple(follow)] += 1
        return sorted(((list(k), c) for k, c in counts.items()), key=lambda kc: (-kc[1], kc[0]))
    return []


def test_continuations_match_brute_force_scan():
    rng = np.random.default_rng(1)
    for _ in range(30):
        tokens = random_tokens(rng, 400, 3)
        store = store_of(tokens)
        for _ in range(10):
            context = rng.integers(0, 4, int(rng.integers(0, 8))).tolist()  # token 3 never occurs
            depth = int(rng.integers(1, 5))
            expected = brute_continuations(tokens, context, 6, 2, depth)
            assert store.continuations(context, 6, 2, 1000, depth) == expected
            assert store.continuations(context, 6, 2, 2, depth) == expected[:2]


def test_continuations_sample_frequent_suffixes_in_proportion():
    # 12000 occurrences of [5, 6], followed by 7 three times out of four: more than one lookup reads.
    follow = np.where(np.arange(12000) % 4 == 0, 8, 7)
    tokens = np.stack([np.full(12000, 5), np.full(12000, 6), follow], axis=1).ravel().astype(np.int32)
    store = store_of(np.append(tokens, np.int32(SEPARATOR)))
    (first, n_first), (second, n_second) = store.continuations([5, 6], 4, 1, 10, 1)
    assert (first, second) == ([7], [8])
    assert abs(n_first - 9000) < 100 and abs(n_second - 3000) < 100


def test_build_from_text_file_splits_blank_line_blocks(tokenizer, tmp_path):
    corpus = tmp_path / "corpus.txt"
    blocks = ["First paragraph, line one.\nLine two.", "Second paragraph.", "Third."]
    corpus.write_text("\n\n".join(blocks) + "\n  \n\n")
    store = build_datastore(tokenizer, corpus, tmp_path / "ds.npz", progress=False)
    expected = sum(([*encode(tokenizer, b), SEPARATOR] for b in blocks), [])
    assert store.tokens.tolist() == expected
    assert store.meta["n_docs"] == 3
    assert store.meta["n_tokens"] == len(expected) - 3


def test_build_from_jsonl_reads_text_completion_and_conversations(tokenizer, tmp_path):
    corpus = tmp_path / "data.jsonl"
    records = [
        {"text": "plain text"},
        {"prompt": "Q: two plus two?", "completion": " A: four"},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"messages": [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}]},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    store = build_datastore(tokenizer, corpus, tmp_path / "ds.npz", progress=False)
    docs = ["plain text", "Q: two plus two? A: four", "hi\nhello", "ping\npong"]
    assert store.tokens.tolist() == sum(([*encode(tokenizer, d), SEPARATOR] for d in docs), [])


def test_malformed_jsonl_is_reported_with_its_line_number(tokenizer, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "ok"}\n\n{"text": "broken"\n')
    with pytest.raises(SpecError, match=r"bad\.jsonl:3: not valid JSON"):
        build_datastore(tokenizer, corpus, tmp_path / "ds.npz", progress=False)
    corpus.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(SpecError, match=r"bad\.jsonl:2: need an object"):
        build_datastore(tokenizer, corpus, tmp_path / "ds.npz", progress=False)


def test_build_from_directory_takes_each_matching_file_as_a_document(tokenizer, tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / ".hidden").mkdir()
    (src / "a.py").write_text("import os\n")
    (src / "pkg" / "b.py").write_text(CODE)
    (src / "pkg" / "notes.txt").write_text("not python")
    (src / "pkg" / "__pycache__" / "c.py").write_text("skipped = 1\n")
    (src / ".hidden" / "d.py").write_text("skipped = 2\n")
    (src / "site-packages").mkdir()
    (src / "site-packages" / "e.py").write_text("skipped = 3\n")
    store = build_datastore(
        tokenizer, src, tmp_path / "ds.npz", pattern="*.py", exclude=["site-*"], progress=False
    )
    expected = [*encode(tokenizer, "import os\n"), SEPARATOR, *encode(tokenizer, CODE), SEPARATOR]
    assert store.tokens.tolist() == expected
    assert store.meta["n_docs"] == 2 and store.meta["pattern"] == "*.py"


def test_save_load_round_trip_and_corrupt_files(tokenizer, tmp_path):
    corpus = tmp_path / "code.py"
    corpus.write_text(CODE)
    built = build_datastore(tokenizer, corpus, tmp_path / "ds.npz", progress=False)
    loaded = Datastore.load(tmp_path / "ds.npz")
    assert np.array_equal(loaded.tokens, built.tokens)
    assert np.array_equal(loaded.suffixes, built.suffixes)
    assert loaded.vocab_hash == vocab_fingerprint(tokenizer)
    assert loaded.meta == built.meta and loaded.meta["corpus"] == str(corpus.resolve())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    with pytest.raises(SpecError, match="does not exist"):
        Datastore.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes((tmp_path / "ds.npz").read_bytes()[:200])
    with pytest.raises(SpecError, match="corrupt"):
        Datastore.load(tmp_path / "bad.npz")
    Datastore(built.tokens, built.suffixes, built.vocab_hash, {"format_version": 0}).save(
        tmp_path / "old.npz"
    )
    with pytest.raises(SpecError, match="another speccore version"):
        Datastore.load(tmp_path / "old.npz")


def make_target_store(
    tokenizer, tmp_path, text: str = CODE * 3 + "def mul(a, b):\n    return b * a\n"
) -> str:
    corpus = tmp_path / "corpus.py"
    corpus.write_text(text)
    build_datastore(tokenizer, corpus, tmp_path / "ds.npz", progress=False)
    return str(tmp_path / "ds.npz")


def test_factory_refuses_missing_datastore_and_another_tokenizer(tokenizer, tokenizer_dir, tmp_path):
    target = SimpleNamespace(tokenizer=tokenizer)
    with pytest.raises(SpecError, match="needs --datastore PATH"):
        make_proposer("rest", ProposerConfig(), target)
    with pytest.raises(SpecError, match="does not exist"):
        make_proposer("rest", ProposerConfig(datastore=str(tmp_path / "none.npz")), target)
    path = make_target_store(tokenizer, tmp_path)
    other = AutoTokenizer.from_pretrained(tokenizer_dir)
    other.add_tokens(["<tool_call_custom>"])
    with pytest.raises(SpecError, match="another tokenizer"):
        make_proposer("rest", ProposerConfig(datastore=path), SimpleNamespace(tokenizer=other))


def tokens_of(tree, row: int) -> list[int]:
    return tree.tokens[row, tree.acceptable[row]].tolist()


def occurs(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_proposer_drafts_a_valid_tree_of_corpus_continuations(tokenizer, tmp_path):
    k = 4
    proposer = make_proposer(
        "rest",
        ProposerConfig(k=k, datastore=make_target_store(tokenizer, tmp_path)),
        SimpleNamespace(tokenizer=tokenizer),
    )
    corpus_ids = proposer.store.tokens.tolist()
    ids = encode(tokenizer, "def mul(a, b):")
    greedy = SamplingParams()
    seqs = [
        Sequence(prompt_ids=ids[:-2], max_new_tokens=50, sampling=greedy, output_ids=ids[-2:]),
        Sequence(prompt_ids=ids[:-2], max_new_tokens=50, sampling=greedy, output_ids=ids[-2:], finished=True),
        Sequence(
            prompt_ids=encode(tokenizer, "Zebra quantum"),
            max_new_tokens=50,
            sampling=greedy,
            output_ids=encode(tokenizer, " waltz"),
        ),
        Sequence(prompt_ids=ids[:-2], max_new_tokens=4, sampling=greedy, output_ids=ids[-2:]),
    ]
    tree = proposer.propose(seqs, StepContext(sampling=greedy, generators=[None] * len(seqs)))
    assert tree.tokens.shape == tree.parents.shape == tree.acceptable.shape
    assert tree.size <= 4 * k  # the default nodes_per_depth
    n_nodes = tree.acceptable.sum(1).tolist()
    assert n_nodes[0] > 1 and n_nodes[1] == 0 and n_nodes[2] == 0
    assert n_nodes[3] > 0
    for row, context in ((0, ids), (3, ids)):
        tokens = tree.tokens[row, : n_nodes[row]].tolist()
        parents = tree.parents[row, : n_nodes[row]].tolist()
        paths: list[list[int]] = []
        for i, (tok, parent) in enumerate(zip(tokens, parents, strict=True)):
            assert -1 <= parent < i
            paths.append((paths[parent] if parent >= 0 else []) + [tok])
        assert max(len(p) for p in paths) <= (k if row == 0 else 1)  # row 3 may emit only 2 more tokens
        for path in paths:
            assert occurs(corpus_ids, context[-2:] + path)
    # After the signature the corpus has mul's docstring three times and a bare return once.
    pieces = [tokenizer.decode([t]) for t in tokens_of(tree, 0)]
    assert pieces == ["\n   ", ' """', "Return", " the", " return", " b", " *"]
    assert tree.parents[0, :7].tolist() == [-1, 0, 1, 2, 0, 4, 5]
    assert proposer.extra_memory_bytes() == proposer.store.tokens.nbytes * 2


def test_best_subtree_keeps_the_heaviest_connected_nodes():
    tokens, parents = best_subtree([([1, 2, 3], 5), ([1, 4], 3), ([9], 2)], max_nodes=4)
    # Weights: 1 -> 8, 2 -> 5, 3 -> 5, 4 -> 3, 9 -> 2.
    assert tokens == [1, 2, 3, 4]
    assert parents == [-1, 0, 1, 0]


# --- knobs -----------------------------------------------------------------------------------


def test_rest_knobs_default_to_the_former_constants_and_are_checked():
    spec = family("rest")
    assert spec.knob_values({}) == {"max_suffix": 16, "min_suffix": 2, "nodes_per_depth": 4}
    grids = {knob.name: knob.grid for knob in spec.knobs}
    assert grids == {"max_suffix": (4, 8, 16, 32), "min_suffix": (1, 2, 3), "nodes_per_depth": (1, 2, 4, 8)}
    assert spec.knob_values({"max_suffix": 4, "min_suffix": 4})["max_suffix"] == 4
    for bad in ({"min_suffix": 5, "max_suffix": 4}, {"min_suffix": 0}, {"nodes_per_depth": 0}):
        with pytest.raises(FamilyError):
            spec.knob_values(bad)
    with pytest.raises(FamilyError, match="unknown option"):
        spec.knob_values({"suffix": 3})


def test_rest_draft_cost_verifies_nodes_per_depth_times_k():
    spec = family("rest")
    target = resolve_target("smollm2-135m-instruct")
    known = Known(target, datastores={"ds-1": DatastoreRef("ds-1", target.tokenizer, 1 << 20)})

    def nodes(**options: int) -> int:
        shape = SimpleNamespace(candidate_id="c", family="rest", draft="ds-1", k=8, tree=None)
        return spec.draft_cost(SimpleNamespace(**vars(shape), options=options), known).verify_nodes

    assert nodes() == 32
    assert nodes(nodes_per_depth=1) == 8
    assert nodes(nodes_per_depth=8) == 64


def test_proposer_honours_each_knob(tokenizer, tmp_path):
    # Two documents sharing the bigram (3, 4): [1 2 3 4 5 6 7 8] and [9 3 4 10 11 12 13].
    tokens = np.array([1, 2, 3, 4, 5, 6, 7, 8, SEPARATOR, 9, 3, 4, 10, 11, 12, 13, SEPARATOR], dtype=np.int32)
    path = tmp_path / "ds.npz"
    Datastore(tokens, suffix_array(tokens), vocab_fingerprint(tokenizer), {"format_version": 1}).save(path)
    greedy = SamplingParams()

    def propose(context: list[int], **knobs: int) -> list[int]:
        config = ProposerConfig(k=4, datastore=str(path), knobs=knobs)
        proposer = make_proposer("rest", config, SimpleNamespace(tokenizer=tokenizer))
        seq = Sequence(prompt_ids=context[:-1], max_new_tokens=50, sampling=greedy, output_ids=context[-1:])
        return tokens_of(proposer.propose([seq], StepContext(sampling=greedy, generators=[None])), 0)

    # max_suffix: [1 2 3 4] is found whole by default; cut to its last two tokens it matches both documents.
    assert propose([1, 2, 3, 4]) == [5, 6, 7, 8]
    assert sorted(propose([1, 2, 3, 4], max_suffix=2)) == [5, 6, 7, 8, 10, 11, 12, 13]
    # min_suffix: a one-token match is tried only when allowed; three tokens are too many for (3, 4).
    assert propose([99, 4]) == [] and len(propose([99, 4], min_suffix=1)) == 8
    assert propose([0, 3, 4], min_suffix=3) == [] and len(propose([0, 3, 4])) == 8
    # nodes_per_depth: the tree's width, k=4 deep (1: a chain).
    assert propose([0, 3, 4], nodes_per_depth=1) in ([5, 6, 7, 8], [10, 11, 12, 13])
    assert len(propose([0, 3, 4], nodes_per_depth=1)) == 4 and len(propose([0, 3, 4], nodes_per_depth=2)) == 8
    with pytest.raises(SpecError, match="min_suffix <= max_suffix"):
        propose([1, 2], min_suffix=3, max_suffix=2)

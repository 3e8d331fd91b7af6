"""The documentation site (mkdocs.yml, docs/) and the README that points into it.

The command-line reference is generated from the real parser (scripts/cli_reference.py), so a
changed option fails here until the page is regenerated; the site builds with --strict (no
broken link, no page left out of the nav); every result file a results page names exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# What no page may cite: documents that are not in this repository.
FOREIGN = ("DESIGN.md", "seed 000", "reference/engines.md")


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_cli_reference_is_what_the_parser_gives_now() -> None:
    reference = _cli_reference()
    committed = reference.OUT.read_text()
    assert committed == reference.render(), (
        "docs/reference/cli.md is stale: run .venv/bin/python scripts/cli_reference.py"
    )


def test_cli_reference_names_every_command() -> None:
    from specops.cli import build_parser

    page = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in sub.choices:
        assert f"## `specops {name}`" in page


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_no_page_cites_a_document_outside_the_repository() -> None:
    for path in [README, *_pages()]:
        text = path.read_text()
        for foreign in FOREIGN:
            assert foreign not in text, f"{path.relative_to(ROOT)} cites {foreign}"


def test_every_result_file_a_results_page_names_exists() -> None:
    pages = sorted((DOCS / "results").glob("*.md"))
    assert pages
    for page in pages:
        if page.name == "index.md":
            continue
        header = re.search(r"^\*\*Results:\*\* (.+)$", page.read_text(), re.MULTILINE)
        assert header, f"{page.name} has no **Results:** line"
        for name in re.findall(r"`([^`]+)`", header.group(1)):
            assert (ROOT / name).exists(), f"{page.name} names {name}, which does not exist"

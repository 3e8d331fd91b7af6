"""Aligned text tables for the CLI's output, drawn by rich.

Every column is as wide as its longest cell, whatever the terminal's width: cells are
never wrapped or cut, so that a long candidate id stays whole on its line, ready to paste.
rich loads only when a table is drawn, so that `specops --help` stays quick.
"""

from __future__ import annotations

import io
from collections.abc import Collection, Iterable, Sequence

# Wider than any table the CLI draws: rich then gives every column its natural width.
_UNBOUNDED = 100_000


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *, right: Collection[str] = ()) -> str:
    """The rows under their header, columns one space apart; those named in `right` right-aligned."""
    from rich.console import Console
    from rich.table import Table

    grid = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style=None)
    for name in header:
        grid.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        grid.add_row(*row)
    out = io.StringIO()
    console = Console(file=out, width=_UNBOUNDED, no_color=True, highlight=False, markup=False, emoji=False)
    console.print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())

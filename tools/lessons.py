"""The size of each course notebook as a learner meets it: its non-blank code lines, and how many of
them come before the first output a learner sees (counted through the cell that shows it).

Usage: python -m tools.lessons        (a table of every notebook in nbs/, lessons then appendix)

A lesson keeps to at most MAX_CODE_LINES code lines, its first output within the first
MAX_FIRST_OUTPUT (tests/test_lessons.py); the appendix notebooks are not held to either.
"""

from __future__ import annotations

import json
from pathlib import Path

from tools.notebooks import is_appendix, notebooks

MAX_CODE_LINES = 400
MAX_FIRST_OUTPUT = 60


def code_stats(path: Path) -> tuple[int, int | None]:
    """A notebook's non-blank code lines, and the code lines up to and including the cell that shows
    its first output (None: no code cell has an output)."""
    total, first = 0, None
    for cell in json.loads(Path(path).read_text(encoding='utf-8'))['cells']:
        if cell['cell_type'] != 'code':
            continue
        total += sum(1 for line in ''.join(cell['source']).splitlines() if line.strip())
        if first is None and cell.get('outputs'):
            first = total
    return total, first


def main() -> None:
    print(f'{"notebook":32} {"track":8} {"code lines":>10} {"first output":>12}')
    for path in notebooks():
        total, first = code_stats(path)
        track = 'appendix' if is_appendix(path) else 'lesson'
        print(f'{path.stem:32} {track:8} {total:>10} {first if first is not None else "-":>12}')


if __name__ == '__main__':
    main()

"""The size of each course notebook as a learner meets it: its non-blank code lines, and how many of
them come before the first output a learner sees (counted through the cell that shows it).

Usage: python -m tools.lessons             (every notebook in nbs/, lessons then appendix)
       python -m tools.lessons --markdown  (the lessons, before the two tracks and now, as markdown)

A lesson keeps to at most MAX_CODE_LINES code lines, its first output within the first
MAX_FIRST_OUTPUT (tests/test_lessons.py); the appendix notebooks are not held to either.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools.notebooks import is_appendix, notebooks

MAX_CODE_LINES = 400
MAX_FIRST_OUTPUT = 60
# each lesson as it stood before the engineering moved to the appendix (commit b3c88d6, before ruff
# formatted the code), counted by `code_stats`; 11_train became the appendix's A3b_train
BEFORE = {
    '00_exercises': (109, 59),
    '01_data': (589, 33),
    '02_cross_entropy': (316, 19),
    '02b_backprop': (317, 19),
    '03_minibatch_training': (346, 23),
    '03b_optimizers': (508, 63),
    '04_callbacks': (733, 253),
    '05_anneal': (471, 76),
    '06_early_stopping': (342, 55),
    '07_progress': (234, 64),
    '08_cnn': (230, 67),
    '08a_hooks_init': (466, 50),
    '08b_batchnorm': (750, 58),
    '09_fp16': (543, 27),
    '10_learner': (580, 46),
    '11_train': (798, 161),
    '12_distributed': (631, 92),
}


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


def markdown_table() -> str:
    "The lessons' sizes before the two tracks and now, and whether each is within the limits."
    rows = [
        '| lesson | code lines before | first output before | code lines now | first output now '
        '| within the limits |',
        '|---|---:|---:|---:|---:|---|',
    ]
    for path in notebooks():
        if is_appendix(path):
            continue
        total, first = code_stats(path)
        was = BEFORE.get(path.stem, ('-', '-'))
        ok = total <= MAX_CODE_LINES and first is not None and first <= MAX_FIRST_OUTPUT
        rows.append(
            f'| {path.stem} | {was[0]} | {was[1]} | {total} | {first} | {"yes" if ok else "no"} |'
        )
    return '\n'.join(rows)


def main() -> None:
    if sys.argv[1:] == ['--markdown']:
        print(markdown_table())
        return
    print(f'{"notebook":32} {"track":8} {"code lines":>10} {"first output":>12}')
    for path in notebooks():
        total, first = code_stats(path)
        track = 'appendix' if is_appendix(path) else 'lesson'
        print(f'{path.stem:32} {track:8} {total:>10} {first if first is not None else "-":>12}')


if __name__ == '__main__':
    main()

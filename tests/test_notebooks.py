"""Every notebook in nbs/ is a test, twice over.

`test_notebook` runs it with nbdev's runner (what `nbdev_test` does), alone in a fresh process:
cells flagged `#| cuda` run where CUDA exists, cells flagged `#| slow` are left to the Run All
below. Skipped cells are not skipped silently: each notebook with cells that no test runs gets an
extra item that reports them as skipped.

`test_notebook_runs_in_plain_jupyter` (with --slow) runs it as a learner's Run All does, in a
Jupyter kernel with `jupyter nbconvert --to notebook --execute` and no flag that skips or tolerates
anything: every cell, slow and cuda ones included (on a machine without CUDA a cuda cell prints one
line saying so), with the inline plot backend. It proves what nbdev's runner cannot: that the flags
are not needed for Run All to get through. So with --slow every slow cell runs once, here, and not a
second time under nbdev's runner: the slowest of them, A3b_train's sixteen seeds, takes over a
minute.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.notebooks import notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebooks()
FLAG_RE = re.compile(r'^\s*#\s*\|\s*(slow|cuda)\s*$', re.M)


def cell_flags(nb: Path) -> dict:
    "How many code cells of `nb` carry each of the flags slow and cuda."
    import json

    counts = {'slow': 0, 'cuda': 0}
    for cell in json.loads(nb.read_text())['cells']:
        if cell['cell_type'] != 'code':
            continue
        for flag in set(FLAG_RE.findall(''.join(cell['source']))):
            counts[flag] += 1
    return counts


def skipped_flags(config) -> list:
    "The cell flags this run cannot or was not asked to run."
    return ([] if config.getoption('--slow') else ['slow']) + (
        [] if torch.cuda.is_available() else ['cuda']
    )


def nbdev_skips(config) -> list:
    """The cell flags `test_notebook` skips: those this run does not run at all, and slow cells,
    which the Run All runs with --slow."""
    return sorted(set(skipped_flags(config)) | {'slow'})


def pytest_generate_tests(metafunc):
    skip = skipped_flags(metafunc.config)
    if 'notebook' in metafunc.fixturenames:
        metafunc.parametrize('notebook', NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
    if 'skipped_cells' in metafunc.fixturenames:
        cases = [
            (nb, flag, n)
            for nb in NOTEBOOKS
            for flag, n in cell_flags(nb).items()
            if n and flag in skip
        ]
        metafunc.parametrize(
            'skipped_cells', cases, ids=[f'{nb.stem}-{flag}' for nb, flag, _ in cases]
        )


def test_notebook(notebook, request):
    skip = nbdev_skips(request.config)
    env = {**os.environ, 'MPLBACKEND': 'Agg'}
    proc = subprocess.run(
        [sys.executable, str(ROOT / 'tests' / 'run_notebook.py'), str(notebook), '--skip', *skip],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f'{notebook.name} failed\n{proc.stdout}\n{proc.stderr}', pytrace=False)


def test_flagged_cells(skipped_cells):
    nb, flag, n = skipped_cells
    why = 'pass --slow to run them' if flag == 'slow' else 'no CUDA device here'
    pytest.skip(f'{nb.name}: {n} cell(s) flagged {flag} not run ({why})')


@pytest.mark.slow
def test_notebook_runs_in_plain_jupyter(notebook, tmp_path):
    # Jupyter's own plot backend, as a learner has it
    env = {k: v for k, v in os.environ.items() if k != 'MPLBACKEND'}
    # --output-dir: the executed copy goes to a temporary folder, not next to the notebook
    cmd = [
        sys.executable,
        '-m',
        'jupyter',
        'nbconvert',
        '--to',
        'notebook',
        '--execute',
        '--output-dir',
        str(tmp_path),
        str(notebook),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(
            f'{notebook.name} stops under Run All in plain Jupyter\n{proc.stderr[-5000:]}',
            pytrace=False,
        )

"""Every notebook in nbs/ is a test: it runs alone, in a fresh process, top to bottom.

Cells flagged `#| slow` run with --slow; cells flagged `#| cuda` run where CUDA exists. Skipped
cells are not skipped silently: each notebook with skipped cells gets an extra item that reports
them as skipped.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'nbs').glob('[0-9][0-9]*_*.ipynb'))  # 02 < 02b < 03: '_' sorts before letters
FLAG_RE = re.compile(r'^\s*#\s*\|\s*(slow|cuda)\s*$', re.M)


def cell_flags(nb: Path) -> dict:
    "How many code cells of `nb` carry each of the flags slow and cuda."
    import json
    counts = {'slow': 0, 'cuda': 0}
    for cell in json.loads(nb.read_text())['cells']:
        if cell['cell_type'] != 'code': continue
        for flag in set(FLAG_RE.findall(''.join(cell['source']))): counts[flag] += 1
    return counts


def skipped_flags(config) -> list:
    "The cell flags this run cannot or was not asked to run."
    return ([] if config.getoption('--slow') else ['slow']) + ([] if torch.cuda.is_available() else ['cuda'])


def pytest_generate_tests(metafunc):
    skip = skipped_flags(metafunc.config)
    if 'notebook' in metafunc.fixturenames:
        metafunc.parametrize('notebook', NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
    if 'skipped_cells' in metafunc.fixturenames:
        cases = [(nb, flag, n) for nb in NOTEBOOKS for flag, n in cell_flags(nb).items() if n and flag in skip]
        metafunc.parametrize('skipped_cells', cases, ids=[f'{nb.stem}-{flag}' for nb, flag, _ in cases])


def test_notebook(notebook, request):
    skip = skipped_flags(request.config)
    env = {**os.environ, 'MPLBACKEND': 'Agg'}
    proc = subprocess.run([sys.executable, str(ROOT / 'tests' / 'run_notebook.py'), str(notebook), '--skip', *skip],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f'{notebook.name} failed\n{proc.stdout}\n{proc.stderr}', pytrace=False)


def test_flagged_cells(skipped_cells):
    nb, flag, n = skipped_cells
    why = 'pass --slow to run them' if flag == 'slow' else 'no CUDA device here'
    pytest.skip(f'{nb.name}: {n} cell(s) flagged {flag} not run ({why})')

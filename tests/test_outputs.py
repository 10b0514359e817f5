"""The committed notebooks carry the outputs that their committed code produces (`python -m
tools.outputs` writes them): a code cell whose source is not the one its outputs came from, an error
or a traceback among the outputs, or a machine path or memory address in them fails here.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.notebooks import ROOT, SOURCE_KEY, notebooks, source_hash

NOTEBOOKS = notebooks()
TRACEBACK = 'Traceback (most recent call last)'
# where a path or an address would say which machine, and which run, the outputs came from
MACHINE_RE = re.compile(
    '|'.join(
        [
            r' at 0x[0-9a-fA-F]{4,}',
            r'/tmp/',
            r'/var/folders/',
            r'/home/\w',
            r'/root\b',
            r'/Users/\w',
            r'[A-Za-z]:\\\\Users',
            r'site-packages',
            re.escape(str(ROOT)),
            re.escape(sys.prefix),
        ]
    )
)


def code_cells(nb: Path) -> list[dict]:
    return [
        c for c in json.loads(nb.read_text(encoding='utf-8'))['cells'] if c['cell_type'] == 'code'
    ]


def texts(output: dict) -> list[str]:
    """Every piece of text in one output: a stream's text, each text/* representation, an error's
    name, value and traceback."""
    parts = [
        output.get('text', ''),
        output.get('ename', ''),
        output.get('evalue', ''),
        *output.get('traceback', []),
    ]
    parts += [v for k, v in output.get('data', {}).items() if k.startswith('text/')]
    return [''.join(p) if isinstance(p, list) else p for p in parts]


@pytest.fixture(params=NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def notebook(request):
    return request.param


def test_outputs_come_from_the_committed_source(notebook):
    stale = [
        c['id']
        for c in code_cells(notebook)
        if c['metadata'].get(SOURCE_KEY) != source_hash(c['source'])
    ]
    assert not stale, (
        f"{notebook.name}: {len(stale)} code cell(s) changed since their outputs were made (ids "
        f"{stale}): "
        f"run `python -m tools.outputs {notebook.stem}`"
    )


def test_no_error_in_outputs(notebook):
    errors = [
        c['id']
        for c in code_cells(notebook)
        for o in c.get('outputs', [])
        if o['output_type'] == 'error' or any(TRACEBACK in t for t in texts(o))
    ]
    assert not errors, f"{notebook.name}: cells {errors} show an error or a traceback"


def test_no_machine_paths_or_addresses_in_outputs(notebook):
    found = [
        (c['id'], m[0])
        for c in code_cells(notebook)
        for o in c.get('outputs', [])
        for t in texts(o)
        for m in MACHINE_RE.finditer(t)
    ]
    assert not found, f"{notebook.name}: outputs name this machine or a memory address: {found[:5]}"


def test_nbdev_clean_changes_nothing(tmp_path):
    # the committed notebooks are clean already, so nbdev_clean keeps every source fingerprint
    # (settings.ini allows its key)
    for nb in NOTEBOOKS:
        shutil.copy(nb, tmp_path / nb.name)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / 'nbdev_clean'), '--fname', str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    changed = [nb.name for nb in NOTEBOOKS if (tmp_path / nb.name).read_bytes() != nb.read_bytes()]
    assert not changed, f"nbdev_clean changes {changed}: run nbdev_clean and commit the result"

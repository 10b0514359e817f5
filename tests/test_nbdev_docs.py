"""nbdev's doc processors handle every notebook: `nbdev.serve.proc_nbs`, the step that nbdev_docs
and nbdev_readme run before handing the notebooks to Quarto (which this project does not install).
Among other things it runs each notebook's import and export cells alone, to render `show_doc`: a
cell that mixes imports with code using other cells' variables, or an annotation naming a class
defined further down, stops it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from tools.notebooks import notebooks

ROOT = Path(__file__).resolve().parents[1]


def test_nbdev_doc_processors_run_on_every_notebook(tmp_path):
    shutil.copy(ROOT / 'settings.ini', tmp_path / 'settings.ini')
    shutil.copytree(ROOT / 'nbs', tmp_path / 'nbs')
    proc = subprocess.run(
        [sys.executable, '-c', 'from nbdev.serve import proc_nbs; proc_nbs(n_workers=0)'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'Found cells containing imports and other code' not in proc.stderr, proc.stderr[-3000:]
    missing = [
        nb.name
        for nb in notebooks(tmp_path / 'nbs')
        if not (tmp_path / '_proc' / nb.name).is_file()
    ]
    assert not missing, f'nbdev did not process {missing}'

"""exp/ must be exactly what nbdev_export writes from the notebooks: nobody edits exp/ by hand."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict:
    """What nbdev_export writes: the Python files (the modules, _modidx.py, __init__.py); exp/ also
    holds package data."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob('*.py'))
        if p.is_file() and '__pycache__' not in p.parts
    }


def test_exp_matches_fresh_export(tmp_path):
    for name in ('settings.ini', 'setup.py', 'README.md'):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / 'nbs', tmp_path / 'nbs')
    proc = subprocess.run(
        [sys.executable, '-c', 'from nbdev.doclinks import nbdev_export; nbdev_export()'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    fresh, committed = _files(tmp_path / 'exp'), _files(ROOT / 'exp')
    assert sorted(fresh) == sorted(committed), 'exp/ holds other modules than the notebooks export'
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, (
        f'exp/ differs from the notebooks in {stale}: run nbdev_export and commit exp/'
    )


def test_no_private_name_is_imported_across_modules():
    """A module uses another's public names only: what one module keeps private (a leading
    underscore) stays there."""
    import ast

    crossings = []
    for path in sorted((ROOT / 'exp').glob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or '').startswith('exp')
            ):
                crossings += [
                    f'{path.name}: {alias.name} from {node.module}'
                    for alias in node.names
                    if alias.name.startswith('_') and alias.name != '__future__'
                ]
    assert not crossings, crossings

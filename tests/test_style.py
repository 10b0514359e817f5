"""Style: every line written by hand fits in 100 characters (the site shows code without scrolling),
and ruff's linter and formatter, configured in pyproject.toml, find nothing to change."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 100


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, '-m', 'ruff', *args], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_lint_finds_nothing():
    proc = ruff('check', '--output-format', 'concise', '.')
    assert proc.returncode == 0, f'ruff check:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}'


def test_ruff_format_changes_nothing():
    proc = ruff('format', '--check', '.')
    assert proc.returncode == 0, (
        f'run `ruff format .`: it would change\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}'
    )


def generated_lines(source: str) -> set[int]:
    "The line numbers of the `__all__` assignment, which nbdev_export writes and wraps at 120."
    lines = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == '__all__' for t in node.targets
        ):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def test_exported_modules_fit_in_100_characters():
    "exp/ is written from the formatted notebooks: only nbdev's own lines may be longer."
    long = []
    for path in sorted((ROOT / 'exp').glob('*.py')):
        if path.name == '_modidx.py':  # nbdev's index of names, one long line each
            continue
        source = path.read_text(encoding='utf-8')
        skip = generated_lines(source)
        long += [
            f'{path.name}:{n}'
            for n, line in enumerate(source.splitlines(), 1)
            if len(line) > LIMIT and n not in skip
        ]
    assert not long, f'lines over {LIMIT} characters (fix them in the notebooks): {long[:20]}'


def test_the_limit_is_the_configured_one():
    import tomllib

    config = tomllib.loads((ROOT / 'pyproject.toml').read_text(encoding='utf-8'))
    assert config['tool']['ruff']['line-length'] == LIMIT

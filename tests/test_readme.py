"""The README is a doorway: short, its commands where CI finds them, its links pointing at files
that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
COMMANDS = ('main', 'test', 'docs', 'docs-check')


def command_after(lines: list[str], name: str) -> str | None:
    "The command `.ci/run` takes for marker `name`: the first line after it that is not a fence."
    marker = f'<!-- command: {name} -->'
    if marker not in lines:
        return None
    for line in lines[lines.index(marker) + 1 :]:
        if not line.startswith('```'):
            return line
    return None


def test_readme_is_under_200_lines():
    n = len(README.read_text(encoding='utf-8').splitlines())
    assert n < 200, f'README.md has {n} lines; the guides in docs/ are where the rest goes'


def test_each_command_marker_is_followed_by_a_command():
    lines = README.read_text(encoding='utf-8').splitlines()
    markers = re.findall(r'^<!-- command: (\S+) -->$', '\n'.join(lines), re.M)
    assert sorted(markers) == sorted(COMMANDS), markers
    for name in markers:
        marker = lines.index(f'<!-- command: {name} -->')
        assert lines[marker + 1] == '```bash', f'{name}: the marker is not followed by a fence'
        command = command_after(lines, name)
        assert command and command.strip() and not command.startswith('#'), (name, command)
        assert lines[marker + 3] == '```', f'{name}: the command is not one line'


def test_the_commands_are_those_ci_runs():
    lines = README.read_text(encoding='utf-8').splitlines()
    assert command_after(lines, 'main') == 'pip install torch==2.13.0 -e . && python -m exp.train'
    assert command_after(lines, 'test') == (
        'pip install -e ".[dev]" && python -m pytest --slow -n auto --dist worksteal'
    )


def test_readme_links_point_at_files():
    text = README.read_text(encoding='utf-8')
    links = re.findall(r'\]\(([^)\s]+)\)', text)
    local = [link.split('#')[0] for link in links if '://' not in link and link.split('#')[0]]
    assert local, 'no links to the guides'
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f'README.md links to files that do not exist: {missing}'
    for guide in (ROOT / 'docs').glob('*.md'):
        if guide.name != 'index.md':
            assert f'docs/{guide.name}' in local, f'README.md does not link docs/{guide.name}'

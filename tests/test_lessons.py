"""Each lesson is the size of its idea: at most 400 non-blank code lines, and its first output
within the first 60 (tools/lessons.py counts them, through the cell that shows the output). The
appendix notebooks are held to neither: they are the engineering a learner may skip."""

import pytest

from tools.lessons import MAX_CODE_LINES, MAX_FIRST_OUTPUT, code_stats, markdown_table
from tools.notebooks import is_appendix, notebooks

LESSONS = [nb for nb in notebooks() if not is_appendix(nb)]


@pytest.mark.parametrize('notebook', LESSONS, ids=[nb.stem for nb in LESSONS])
def test_lesson_within_its_limits(notebook):
    lines, first = code_stats(notebook)
    assert lines <= MAX_CODE_LINES, f'{notebook.name}: {lines} code lines'
    assert first is not None, f'{notebook.name} shows no output'
    assert first <= MAX_FIRST_OUTPUT, f'{notebook.name}: its first output after {first} code lines'


def test_the_limits_count_what_they_say(tmp_path):
    "Blank lines do not count; the first output is counted through the cell that shows it."
    import json

    cells = [
        {'cell_type': 'markdown', 'source': 'x'},
        {'cell_type': 'code', 'source': 'a = 1\n\nb = 2', 'outputs': []},
        {'cell_type': 'code', 'source': 'print(a)\n', 'outputs': [{'output_type': 'stream'}]},
        {'cell_type': 'code', 'source': 'c = 3', 'outputs': []},
    ]
    path = tmp_path / '01_demo.ipynb'
    path.write_text(json.dumps({'cells': cells}))
    assert code_stats(path) == (4, 3)
    cells[2]['outputs'] = []
    path.write_text(json.dumps({'cells': cells}))
    assert code_stats(path) == (4, None)


def test_the_size_table_has_every_lesson():
    table = markdown_table()
    for nb in LESSONS:
        assert f'| {nb.stem} |' in table, nb.stem

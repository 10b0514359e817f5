"""Each lesson is the size of its idea: at most 400 non-blank code lines, and its first output
within the first 60 (tools/lessons.py counts them). Notebooks still being split into lesson and
appendix are held to their size today instead, in CEILINGS: an entry may only come down, and goes
once its notebook is within the limits."""

import pytest

from tools.lessons import MAX_CODE_LINES, MAX_FIRST_OUTPUT, code_stats
from tools.notebooks import is_appendix, notebooks

# notebook: (code lines, code lines through the first output), as they stand; lower them as the
# lessons are split.
CEILINGS = {
    '08b_batchnorm': (783, 60),
    '12_distributed': (488, 60),
}
LESSONS = [nb for nb in notebooks() if not is_appendix(nb)]


@pytest.mark.parametrize('notebook', LESSONS, ids=[nb.stem for nb in LESSONS])
def test_lesson_within_its_limits(notebook):
    lines, first = code_stats(notebook)
    max_lines, max_first = CEILINGS.get(notebook.stem, (MAX_CODE_LINES, MAX_FIRST_OUTPUT))
    assert lines <= max(max_lines, MAX_CODE_LINES), f'{notebook.name}: {lines} code lines'
    assert first is not None, f'{notebook.name} shows no output'
    assert first <= max(max_first, MAX_FIRST_OUTPUT), (
        f'{notebook.name}: its first output comes after {first} code lines'
    )


def test_ceilings_name_only_lessons_over_the_limits():
    "A ceiling goes once its notebook is within the limits, so that the table shows what is left."
    stems = {nb.stem: nb for nb in LESSONS}
    stale = [name for name in CEILINGS if name not in stems]
    assert not stale, f'CEILINGS names notebooks that are not lessons: {stale}'
    within = [
        name
        for name, nb in stems.items()
        if name in CEILINGS
        and code_stats(nb)[0] <= MAX_CODE_LINES
        and code_stats(nb)[1] <= MAX_FIRST_OUTPUT
    ]
    assert not within, f'within the limits now: drop them from CEILINGS: {within}'


def test_the_size_table_has_every_lesson():
    from tools.lessons import markdown_table

    table = markdown_table()
    for nb in LESSONS:
        assert f'| {nb.stem} |' in table, nb.stem

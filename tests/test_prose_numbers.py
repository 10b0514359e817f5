"""Numbers in a lesson's prose come from its outputs (DESIGN.md, convention 15).

The convention, checked here on the committed notebooks:

- A *figure* is a number the prose states with a precision: a decimal with two or more digits after
  the point (`0.894`, `0.57`), or a ratio or a share written `1.7x`, `1.7 times` or `3.0%`. Code
  spans and maths are not prose (`2**-14`, `$\\sqrt{2/144}$`), and neither are settings with one
  decimal (`lr 0.4`).
- A figure in a markdown cell is printed by a code cell of the same section (the cells between two
  headings of level 2 or 3), in its committed text output, rounded to the prose's precision: `0.57`
  matches a printed `0.574`. A Summary restates: it may quote any output of its notebook.
- A figure in a code comment is printed by its own cell or a cell above it.
- A figure that is not measured by the notebook (a setting, a constant, a figure quoted from
  fastai's documentation) is listed in NOT_MEASURED with what it is; a markdown cell that quotes a
  benchmark run is listed in FROM_FILE, and its figures are checked against that file.

So a sentence that says 0.915 beside a table that prints 0.8940 fails, and so does one that keeps
an old figure after the code that measured it changed.
"""

import json
import re
from pathlib import Path

import pytest

from tools.notebooks import is_appendix, notebooks

ROOT = Path(__file__).resolve().parents[1]
# the lessons this convention holds for: every one, as tests/test_lessons.py lists them
LESSONS = [nb.stem for nb in notebooks() if not is_appendix(nb)]
FIGURE_RE = re.compile(
    r'(?<![\w.])(\d+\.\d+)(?=x\b|\s+times\b|%)|(?<![\w.\-])(\d+\.\d{2,})(?![\w.]|\.\d)'
)
NUMBER_RE = re.compile(r'\d+(?:,\d{3})*(?:\.\d+)?')
HEADING_RE = re.compile(r'^#{2,3} ', re.M)
# (notebook, figure): what it is, where it is not a measurement
NOT_MEASURED = {
    ('02_cross_entropy', '0.001'): "float32's spacing near 10,000 (2**-10), a constant",
    ('02_cross_entropy', '0.90'): 'the threshold of the final check, a setting',
    ('03b_optimizers', '0.99'): 'a beta of the EWMA plots and checks, a setting',
    ('03b_optimizers', '0.01'): 'a learning rate (momentum in words, exercise 3), a setting',
    ('03b_optimizers', '0.999'): "Adam's second beta, a setting",
    ('04_callbacks', '0.90'): 'a threshold the exercise sets',
    ('05_anneal', '0.95'): "one-cycle's starting momentum, a setting",
    ('05_anneal', '0.85'): "one-cycle's lowest momentum, a setting",
    ('08_cnn', '0.01'): 'the tolerance of the check on the init',
    ('08_cnn', '2.4'): "sqrt(6) / sqrt(2): PyTorch's init against He's, derived in 08a",
    ('08a_hooks_init', '2.4'): "sqrt(6) / sqrt(2), quoted from 08 and derived here",
    ('08a_hooks_init', '0.4'): '1 / sqrt(6), derived below and checked layer by layer',
    ('08a_hooks_init', '0.41'): '1 / sqrt(6), derived in the sentence',
    ('08a_hooks_init', '0.58'): 'the std of the ReLU of a unit normal, a constant',
    ('08a_hooks_init', '0.25'): "the histogram's first bin, a setting",
    ('08a_hooks_init', '0.01'): 'x0.1 per layer, in a comment on the maths',
    ('08a_hooks_init', '0.001'): '0.5 ** 10, in a comment on the maths',
    ('08b_batchnorm', '0.01'): "running batch norm's floor for the variance, a setting",
    ('09_fp16', '0.0001'): 'the update the first cell adds to 1',
    ('09_fp16', '0.963'): "fastai v1's documented accuracy for its example",
    ('09_fp16', '0.16'): "the table's 2.54 - 2.38 GiB",
    ('09_fp16', '0.26'): 'the half copy of the MLP: 140.7 million weights of 2 bytes',
    ('09_fp16', '2.13'): "torch's version",
    ('10_learner', '0.963'): "fastai v1's documented accuracy for its example",
    ('13_resnet', '0.01'): "the one-cycle schedule's peak lr, a setting",
    ('13_resnet', '0.928'): "course22p2's published result (its ResNet, 5 epochs, on a GPU)",
}
# bench/lesson_seeds.py's output: the seed sweeps lessons 03 and 03b quote
SEEDS = 'bench/results/lesson-seeds-cpu-2026-12-07.txt'
# (notebook, markdown cell id): the benchmark output its figures come from
FROM_FILE = {
    ('03_minibatch_training', '72f8508d'): SEEDS,
    ('03_minibatch_training', 'de6cf2f7'): SEEDS,
    ('03b_optimizers', 'ed4031c0'): SEEDS,
    ('03b_optimizers', '313037ae'): SEEDS,
    ('09_fp16', '29d8a2a2'): 'bench/results/gpu-h200-2026-12-04.txt',
    # bench/seed_example.py's figures, in the table of its section
    ('10_learner', 'b3ddef65'): 'bench/README.md',
    ('10_learner', '39f4d096'): 'bench/README.md',
}

# figures pinned to the column that prints them, where a number alone could match another column:
# (notebook, cell id of the prose, a regex of the figure in it, cell id of the output, a regex of
# the figure there)
CLAIMS = [
    (
        '08b_batchnorm',
        'eed74fe8',
        r"batch norm's runs\s+ended at (\d\.\d+)",
        '504dc354',
        r'BatchNorm2d(?: +\d\.\d+){5} +(\d\.\d+)',
    ),
    (
        '08b_batchnorm',
        'eed74fe8',
        r"running batch norm's at (\d\.\d+)",
        '504dc354',
        r'RunningBatchNorm(?: +\d\.\d+){5} +(\d\.\d+)',
    ),
    (
        '08a_hooks_init',
        '7ea3e41b',
        r"the first ReLU's standard deviation is\s+about (\d\.\d+)",
        '82b72807',
        r'first batch: \[(\d\.\d+)',
    ),
]


def cells(stem: str) -> list:
    return json.loads((ROOT / 'nbs' / f'{stem}.ipynb').read_text())['cells']


def text_output(cell: dict) -> str:
    "What a code cell printed or returned, as text (plots left out)."
    out = []
    for o in cell.get('outputs', []):
        if 'text' in o:
            out.append(''.join(o['text']))
        elif 'image/png' not in o.get('data', {}):
            out.append(''.join(o.get('data', {}).get('text/plain', '')))
    return '\n'.join(out)


def prose(source: str) -> str:
    "Markdown without its code spans, code blocks and maths."
    source = re.sub(r'```.*?```', ' ', source, flags=re.S)
    source = re.sub(r'`[^`]*`', ' ', source)
    return re.sub(r'\$\$.*?\$\$|\$[^$]*\$', ' ', source, flags=re.S)


def figures(text: str) -> list[str]:
    return [a or b for a, b in FIGURE_RE.findall(text)]


def comments(source: str) -> str:
    "The comments of a code cell (a `#` to the end of its line, outside strings: roughly)."
    return '\n'.join(
        line.split('  # ', 1)[1] if '  # ' in line else line.strip()[1:]
        for line in source.splitlines()
        if '  # ' in line or line.strip().startswith('#') and not line.strip().startswith('#|')
    )


def printed(figure: str, text: str) -> bool:
    "Whether `text` holds a number that rounds to `figure` at its precision."
    digits = len(figure.split('.')[1])
    value = float(figure)
    for number in NUMBER_RE.findall(text):
        number = float(number.replace(',', ''))
        if abs(round(number, digits) - value) < 10 ** -(digits + 3):
            return True
    return False


def unprinted(stem: str) -> list[str]:
    "Every figure in `stem`'s prose and comments that its outputs do not print."
    nb = cells(stem)
    # each cell's parts, with the section each belongs to: a markdown cell's text before its first
    # heading ends the section before it
    section, parts = 0, []
    for cell in nb:
        source = ''.join(cell['source'])
        markdown = cell['cell_type'] == 'markdown'
        cuts = [m.start() for m in HEADING_RE.finditer(source)] if markdown else []
        bounds = sorted({0, len(source), *cuts})
        cell_parts = []
        for piece in [source[a:b] for a, b in zip(bounds, bounds[1:])] or [source]:
            if markdown and HEADING_RE.match(piece):
                section += 1
            cell_parts.append((section, piece))
        parts.append(cell_parts)
    outputs = {}  # section -> what its code cells print
    for cell, cell_parts in zip(nb, parts):
        if cell['cell_type'] == 'code':
            outputs[cell_parts[0][0]] = outputs.get(cell_parts[0][0], '') + text_output(cell)
    every_output = '\n'.join(outputs.values())
    missing = []
    for i, (cell, cell_parts) in enumerate(zip(nb, parts)):
        for section, source in cell_parts:
            if cell['cell_type'] == 'code':
                found = '\n'.join(text_output(c) for c in nb[: i + 1] if c['cell_type'] == 'code')
                quoted = figures(comments(source))
            else:
                if (stem, cell['id']) in FROM_FILE:
                    found = (ROOT / FROM_FILE[stem, cell['id']]).read_text()
                elif source.startswith('## Summary'):
                    found = every_output + ''.join(
                        (ROOT / path).read_text() for (s, _), path in FROM_FILE.items() if s == stem
                    )
                else:
                    found = outputs.get(section, '')
                quoted = figures(prose(source))
            for figure in quoted:
                if (stem, figure) not in NOT_MEASURED and not printed(figure, found):
                    missing.append(f'{stem} cell {i} ({cell["id"]}): {figure} is not printed')
    return missing


@pytest.mark.parametrize('stem', LESSONS)
def test_figures_in_prose_are_printed(stem):
    assert unprinted(stem) == []


def test_the_convention_finds_a_contradiction():
    "The checks themselves: a figure, its precision, what counts as printed."
    assert figures('ends at 0.894, up to 1.6 times, 1.7x as long, 3.0% of them; lr 0.4') == [
        '0.894',
        '1.6',
        '1.7',
        '3.0',
    ]
    assert figures(prose('`1 + 0.0001` and $0.118$ and 0.57')) == ['0.57']
    assert printed('0.57', 'mean 0.574') and printed('0.894', 'valid 0.8940')
    assert not printed('0.915', 'valid 0.8940') and not printed('1.6', 'fp16 1.7x')
    assert printed('58.38', 'samples/s 58.383')
    assert comments("assert a >= 0.88, a  # 0.915 with seed 42\n# seeds 0-9: 0.925") == (
        '0.915 with seed 42\n seeds 0-9: 0.925'
    )


def test_not_measured_figures_are_still_there():
    "An entry of NOT_MEASURED or FROM_FILE that no prose uses any more goes."
    for stem, figure in NOT_MEASURED:
        text = '\n'.join(
            prose(''.join(c['source'])) if c['cell_type'] == 'markdown' else ''.join(c['source'])
            for c in cells(stem)
        )
        assert figure in text, (stem, figure)
    for stem, cell_id in FROM_FILE:
        assert cell_id in {c['id'] for c in cells(stem)}, (stem, cell_id)


@pytest.mark.parametrize('stem, prose_id, prose_re, output_id, output_re', CLAIMS)
def test_pinned_figures(stem, prose_id, prose_re, output_id, output_re):
    "A figure of the prose equals, at its precision, the one its cell prints in that place."
    by_id = {c['id']: c for c in cells(stem)}
    quoted = re.findall(prose_re, prose(''.join(by_id[prose_id]['source'])))
    shown = re.findall(output_re, text_output(by_id[output_id]))
    assert len(quoted) == 1 and len(shown) == 1, (quoted, shown)
    assert printed(quoted[0], shown[0]), (quoted[0], shown[0])


TABLE_HEADER_RE = re.compile(r'^ *epoch +train_loss.*$', re.M)
LOG_LINE_RE = re.compile(r'\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\bpid\b|^[IWE]\d{4} ', re.M)


@pytest.mark.parametrize('stem', LESSONS)
def test_outputs_a_learner_can_read(stem):
    "No table header without its rows (a refusal shown after it), no raw log lines with dates."
    for cell in cells(stem):
        if cell['cell_type'] != 'code':
            continue
        text = text_output(cell)
        for header in TABLE_HEADER_RE.finditer(text):
            rows = text[header.end() :].lstrip('\n').splitlines()
            assert rows and re.match(r' +\d+ ', rows[0]), (stem, cell['id'], text[:300])
        assert not LOG_LINE_RE.search(text), (stem, cell['id'], text[:300])

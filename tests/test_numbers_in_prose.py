"""Numbers in prose come from outputs: a figure with decimals, or a ratio such as "1.4x", written in
a lesson's markdown must be printed by one of its cells or written in its code (a setting, a
threshold), unless it is a fact that holds on any machine, listed below with why. Checked for the
lessons named here."""

import json
import re
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parents[1] / 'nbs'
LESSONS = ['01b_matmul', '02_cross_entropy']
# facts of arithmetic, true everywhere: written in prose, printed by no cell
FACTS = {
    '02_cross_entropy': {
        '3.4e38',  # float32's largest number
        '1000.3',  # the exact log-softmax of a logit 1000 below the largest
        '0.001',  # the gap between neighbouring float32 numbers near 10,000
    },
}
# a number with decimals, or a number followed by x (a speed-up)
NUMBER = re.compile(r'(?<![\w.])(\d[\d,]*\.\d+(?:e[+-]?\d+)?|\d[\d,]*(?:\.\d+)?(?=x\b))')


def prose_numbers(cells: list[dict]) -> set[str]:
    "The numbers in the markdown cells, outside LaTeX and `code`."
    text = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    text = re.sub(r'\$\$.*?\$\$|\$[^$]*\$|`[^`]*`', ' ', text, flags=re.S)
    return set(NUMBER.findall(text))


def printed_and_coded(cells: list[dict]) -> str:
    "The code cells' sources and every text they output, as one string."
    parts = []
    for c in cells:
        if c['cell_type'] != 'code':
            continue
        parts.append(''.join(c['source']))
        for out in c.get('outputs', []):
            parts.append(''.join(out.get('text', '')))
            parts.append(''.join(out.get('data', {}).get('text/plain', '')))
    return '\n'.join(parts)


def unsupported(cells: list[dict], facts: set[str]) -> list[str]:
    "The numbers in prose found in no output and no code, facts aside."
    shown = printed_and_coded(cells)
    return sorted(
        n
        for n in prose_numbers(cells) - facts
        if not re.search(r'(?<![\d.])' + re.escape(n), shown)
    )


@pytest.mark.parametrize('stem', LESSONS)
def test_every_number_in_the_prose_is_printed(stem):
    cells = json.loads((NBS / f'{stem}.ipynb').read_text(encoding='utf-8'))['cells']
    assert not unsupported(cells, FACTS.get(stem, set())), stem


def test_a_figure_the_cells_do_not_print_is_found():
    "The contradictions this check was written for: speed-ups and accuracies no cell printed."
    md = lambda s: {'cell_type': 'markdown', 'source': [s]}
    code = {'cell_type': 'code', 'source': ['r = 1.37'], 'outputs': [{'text': ['eager 1.37x']}]}
    cells = [md('eager 2.0-2.3x and compiled 1.23-1.26x; seeds gave 0.918 to 0.936'), code]
    assert unsupported(cells, set()) == ['0.918', '0.936', '1.23', '1.26', '2.0', '2.3']
    cells = [md('eager 1.37x, as printed; `0.5` in code and $e^{0.5}$ do not count'), code]
    assert unsupported(cells, set()) == []

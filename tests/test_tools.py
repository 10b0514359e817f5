"""The notebook tools: the course order, the source fingerprint, and the outputs refresh on small
notebooks."""

import json
import sysconfig
import tempfile

import nbformat
import pytest
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test

from tools import outputs
from tools.notebooks import SOURCE_KEY, is_appendix, notebook_key, notebooks, source_hash


def test_notebooks_in_course_order(tmp_path):
    names = [
        '10_learner.ipynb',
        '03_minibatch.ipynb',
        '02b_backprop.ipynb',
        '02_cross_entropy.ipynb',
        '08a_hooks.ipynb',
        '08_cnn.ipynb',
        'A10_late.ipynb',
        'A2_checkpoint.ipynb',
        'A1_downloads.ipynb',
        'A1b_cache.ipynb',
        'index.ipynb',
        '2_short.ipynb',
        '02B_upper.ipynb',
        'A_nonumber.ipynb',
        'a1_lower.ipynb',
        '02_notes.md',
    ]
    for name in names:
        (tmp_path / name).write_text('{}')
    lessons = [
        '02_cross_entropy.ipynb',
        '02b_backprop.ipynb',
        '03_minibatch.ipynb',
        '08_cnn.ipynb',
        '08a_hooks.ipynb',
        '10_learner.ipynb',
    ]
    appendix = ['A1_downloads.ipynb', 'A1b_cache.ipynb', 'A2_checkpoint.ipynb', 'A10_late.ipynb']
    ft.test_eq([p.name for p in notebooks(tmp_path)], lessons + appendix)
    ft.test_eq([is_appendix(p) for p in notebooks(tmp_path)], [False] * 6 + [True] * 4)
    ft.test_fail(
        lambda: notebook_key(tmp_path / 'index.ipynb'),
        contains="'index.ipynb' is not a course notebook name",
    )


def test_every_notebook_in_nbs_is_found():
    "No notebook in nbs/ is left out of the tools (tests, outputs, site): each has a course name."
    found = {p.name for p in notebooks()}
    assert found and found == {p.name for p in outputs.NBS.glob('*.ipynb')}


def test_source_hash():
    ft.test_eq(source_hash('x = 1\nx'), source_hash(['x = 1\n', 'x']))
    assert source_hash('x = 1') != source_hash('x = 2') and len(source_hash('')) == 16


def test_scrub_text(monkeypatch):
    monkeypatch.setenv('EXP_DATA', '/somewhere/cache')
    subs = outputs.path_replacements()
    tmp = tempfile.gettempdir()
    text = (
        f"<exp.callbacks.Runner at 0x7fcba8e03f50> checkpoint {tmp}/tmpgts9_b54/resume.pth, "
        f"cache /somewhere/cache/mnist, code {outputs.ROOT}/nbs, magic 0x01000803"
    )
    ft.test_eq(
        outputs.scrub_text(text, subs),
        '<exp.callbacks.Runner> checkpoint <tmp>/resume.pth, cache $EXP_DATA/mnist, code '
        '<repo>/nbs, magic 0x01000803',
    )
    # torch's log lines: the same source file, whichever Python ran it
    purelib = sysconfig.get_paths()['purelib']
    for log in (
        'E1204 api.py site-packages/torch/distributed/run.py:1002] failed',
        'E1204 api.py torch/distributed/run.py:1002] failed',
    ):
        ft.test_eq(
            outputs.scrub_text(log, subs), 'E1204 api.py torch/distributed/run.py:1002] failed'
        )
    ft.test_eq(outputs.scrub_text(f'{purelib}/torch/x.py', subs), '<site-packages>/torch/x.py')


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata.kernelspec = {'display_name': 'python3', 'language': 'python', 'name': 'python3'}
    nbformat.write(nb, path)
    return path


def test_refresh_writes_scrubbed_outputs_and_fingerprints(tmp_path):
    nb = _notebook(
        tmp_path / '01_demo.ipynb',
        'import os, tempfile\nprint(tempfile.mkdtemp())',
        "import sys, time\nprint(os.environ['PYTHONHASHSEED'], os.environ['CUDA_VISIBLE_DEVICES'] "
        "== '')\n"
        # two messages: one output, as Jupyter shows them
        "sys.stdout.flush(); time.sleep(0.5)\nprint('more')",
        'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);',
    )
    assert outputs.refresh(nb, outputs.path_replacements())
    cells = json.loads(nb.read_text())['cells']
    ft.test_eq(
        [c['metadata'][SOURCE_KEY] for c in cells], [source_hash(c['source']) for c in cells]
    )
    ft.test_eq(cells[0]['outputs'][0]['text'], ['<tmp>\n'])
    ft.test_eq(
        cells[1]['outputs'],
        [{'name': 'stdout', 'output_type': 'stream', 'text': ['0 True\n', 'more\n']}],
    )
    assert 'image/png' in cells[2]['outputs'][0]['data'], 'the plot is not in the outputs'


def test_refresh_leaves_a_failing_notebook_unchanged(tmp_path, capsys):
    nb = _notebook(tmp_path / '01_demo.ipynb', 'x = 1', "raise ValueError('broken on purpose')")
    before = nb.read_bytes()
    assert not outputs.refresh(nb, outputs.path_replacements())
    ft.test_eq(nb.read_bytes(), before)
    assert 'broken on purpose' in capsys.readouterr().err


def test_resolve_names_notebooks():
    first = notebooks()[0]
    ft.test_eq(outputs.resolve([first.stem, first.name, str(first)]), [first] * 3)
    with pytest.raises(SystemExit, match="no notebook 'nope'"):
        outputs.resolve(['nope'])


def test_site_shows_a_patched_method_like_a_method():
    "A function patched onto a class (`self: Learner`) is shown without its first parameter."
    from fastcore.basics import patch

    from tools import site

    class Host:
        "A class to patch."

    @patch
    def go(self: Host, epochs: int, lr: float = 0.1) -> None:
        "Go."

    text = site._member(Host, 'go', Host.__dict__['go'], __name__, patched=True)
    assert 'Host.go(epochs: int, lr: float = 0.1) -> None' in text, text
    assert site.signature(Host.__dict__['go']).startswith('(self: ')  # as a function


def test_site_describes_every_entry():
    "Event handlers say when they run; an override takes its base's docstring; else a known line."
    from torch import nn

    from tools import site

    class Cb:
        def begin_fit(self):
            pass

    class Net(nn.Module):
        def forward(self, x):
            return x

    ft.test_eq(site.describe('Cb.begin_fit', '', 'begin_fit', Cb), site.EVENT_DOCS['begin_fit'])
    assert site.describe('Net.forward', '', 'forward', Net).startswith('As `Module.forward`: ')
    ft.test_eq(site.describe('Cb.x', 'Its own.', 'x', Cb), 'Its own.')
    ft.test_eq(site.describe('Cb.nothing', '', 'nothing', Cb), '')
    assert set(site.EVENT_DOCS) >= {
        'begin_fit',
        'begin_epoch',
        'begin_batch',
        'after_pred',
        'after_loss',
        'after_backward',
        'after_step',
        'after_batch',
        'begin_validate',
        'after_epoch',
        'after_fit',
    }


def test_site_notebooks_lose_their_directives():
    from tools import site

    nb = {
        'cells': [
            {'cell_type': 'code', 'source': '#| default_exp data', 'outputs': []},
            {'cell_type': 'code', 'source': '#| export\n#|slow\nx = 1\n', 'outputs': []},
            {'cell_type': 'markdown', 'source': 'Cells marked `#| export` ...'},
            {'cell_type': 'code', 'source': ['#| cuda\n', 'print(1)'], 'outputs': [{'x': 1}]},
        ]
    }
    cells = site.without_directives(nb)['cells']
    ft.test_eq([c['source'] for c in cells], ['x = 1', 'Cells marked `#| export` ...', 'print(1)'])
    ft.test_eq(cells[2]['outputs'], [{'x': 1}])


def test_site_tables_hold_every_notebook_once_each_in_its_track():
    from tools import site
    from tools.notebooks import NBS

    nbs = [site.Notebook(p) for p in notebooks(NBS)]
    lessons, appendix = site.lessons(nbs), site.appendix(nbs)
    assert lessons and appendix and len(lessons) + len(appendix) == len(nbs)
    assert all(nb.path.stem[0].isdigit() for nb in lessons)
    assert all(nb.path.stem.startswith('A') for nb in appendix)
    index = site.index_page(nbs)
    for nb in nbs:
        assert index.count(f'(nbs/{nb.path.stem}.ipynb)') == 1, nb.path.stem


def test_site_toc_has_the_guides_before_the_reference():
    from tools import site
    from tools.notebooks import NBS

    toc = site.toc([site.Notebook(p) for p in notebooks(NBS)], ['exp.data'])
    guides, reference = toc.index('caption: Guides'), toc.index('caption: API reference')
    assert guides < reference
    for guide in site.guides():
        assert guides < toc.index(f'file: docs/{guide}\n') < reference
    assert guides < toc.index('file: bench/README') < reference


def test_site_describes_a_constant_by_its_comment_even_when_re_exported(monkeypatch):
    import inspect
    import types

    import exp.data
    from tools import site

    said = 'The largest seed every generator takes (an int64).'
    ft.test_eq(site.constant_doc(exp.data, 'MAX_SEED'), said)
    lesson = types.ModuleType('exp.lesson')
    lesson.__package__ = 'exp'
    source = 'from .data import (\n    MAX_SEED,\n    set_seed,\n)\nfrom .loss import accuracy\n'
    getsource = inspect.getsource
    monkeypatch.setattr(inspect, 'getsource', lambda o: source if o is lesson else getsource(o))
    ft.test_eq(site.constant_doc(lesson, 'MAX_SEED'), said)
    ft.test_eq(site.constant_doc(lesson, 'NOT_THERE'), '')


def test_architecture_page_is_what_the_code_says():
    "docs/architecture.md's layers and method table are those the code has today."
    from tools import architecture

    page = architecture.PAGE.read_text()
    assert page == architecture.refreshed(page), "run python -m tools.architecture --write"


def test_architecture_layers_follow_the_imports():
    "Every module sits below each module it imports; the whole Learner has each lesson's methods."
    from tools import architecture

    level = {m: i for i, layer in enumerate(architecture.layers()) for m in layer}
    assert level['callbacks'] > level['runner'] and level['train'] > level['distributed']
    for module in level:
        assert all(level[d] < level[module] for d in architecture.imports(module)), module
    homes = {name: module for name, module, _ in architecture.learner_methods()}
    assert homes['fit'] == 'learner' and homes['to_distributed'] == 'distributed'
    assert homes['find'] == 'callbacks'

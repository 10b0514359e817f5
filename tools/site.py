"""Build the course website: the notebooks with their committed outputs, in course order, and an API
reference of every exported name, with Jupyter Book 1's stack (Sphinx, myst-nb, sphinx-book-theme).
Nothing is executed.

Usage: python -m tools.site [--out _site]        (the pages land in OUT/html)

The source tree is assembled in OUT/src: docs/conf.py, docs/index.md with the tables of the
notebooks, the notebooks from nbs/ (nbdev's `#|` directive lines taken out), the guides (docs/*.md,
at docs/ as in the repository, so that their relative links work in both places), bench/README.md
and the history under bench/results/, a table of contents (the lessons, the appendix, the guides,
the API reference), and one reference page per module, generated from the package. Any Sphinx
warning fails the build, and so do an exported name missing from the built reference and an entry
of the reference without a description. The build writes OUT/pages.txt, the pages it made, which
tools.check_site checks one by one.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import shutil
import subprocess
import sys
import time
from functools import cached_property
from pathlib import Path

from tools.lessons import markdown_table
from tools.notebooks import NBS, ROOT, is_appendix, notebooks

DOCS = ROOT / 'docs'
BENCH = ROOT / 'bench'
# the guides in the order the table of contents shows them; a page of docs/ not named here follows
# them in alphabetical order
GUIDES = (
    'install',
    'lessons',
    'trainer',
    'faults',
    'distributed',
    'data',
    'library',
    'architecture',
    'site',
    'authoring',
)
# the Runner's event protocol (DESIGN.md): a handler without a docstring says when it runs
EVENT_DOCS = {
    'begin_fit': 'Runs once at the start of a fit, before the first epoch.',
    'begin_epoch': 'Runs at the start of each epoch, before its training batches.',
    'begin_batch': 'Runs at the start of each batch, training and validation, before the forward '
    'pass.',
    'after_pred': "Runs after each batch's forward pass, before its loss.",
    'after_loss': "Runs after each batch's loss is computed (in validation, then after_batch).",
    'after_backward': "Runs after each training batch's backward pass, before the optimizer step.",
    'after_step': "Runs after each training batch's optimizer step.",
    'after_batch': 'Runs at the end of each batch, training and validation.',
    'begin_validate': "Runs after an epoch's training batches, before its validation batches.",
    'after_epoch': "Runs at the end of each epoch, after its validation.",
    'after_fit': 'Runs at the end of a fit, always: also after an exception or a cancel.',
    'after_cancel_batch': 'Runs when a CancelBatchException ends a batch early.',
    'after_cancel_epoch': 'Runs when a CancelEpochException ends an epoch early.',
    'after_cancel_train': 'Runs when a CancelTrainException ends the fit early.',
    'after_cancel_step': 'Runs when a CancelStepException skips an optimizer step (mixed '
    'precision, on overflow).',
}
# what the source says in no docstring or comment: keyed by the name (a class's member as
# Class.name), not the module, so that a name keeps its line when it moves
DESCRIPTIONS = {
    'EVENTS': "The Runner's events, in the order a fit meets them.",
    'IDX_DTYPES': "The IDX format's type codes and the dtype each stands for.",
    'IDX_FILES': 'The four files of an MNIST-style folder, without their .gz.',
    'DATASETS': 'The data sets `get_data` downloads: their files, sizes, sums and mirrors.',
    'KNOWN_DATA': 'The names `get_data` takes: the embedded digits, then the downloads.',
    'ENV_VARS': "torchrun's environment variables that a distributed run needs.",
    'DISPLAYS': "The progress display's modes.",
    'ARCHS': "The models the trainer's --arch takes.",
    'FP16_MODES': "The precisions the trainer's --fp16 takes.",
    'CHECKPOINT': "The checkpoint's file name in a run folder.",
    'DataBunch.train_ds': 'The training set, behind the training loader.',
    'DataBunch.valid_ds': 'The validation set, behind the validation loader.',
    'Runner.model': "The learner's model.",
    'Runner.opt': "The learner's optimizer.",
    'Runner.loss_func': "The learner's loss function.",
    'Runner.data': "The learner's DataBunch.",
    'Runner.all_batches': 'Run one batch for each batch of `dl`, stopping at a cancelled epoch.',
    'Callback.set_runner': 'Attach the callback to the Runner `run` that calls it.',
    'AvgStats.reset': 'Zero the sums and counts, for a new epoch.',
    'AvgStats.all_stats': 'The loss and the metrics, averaged over the samples seen so far.',
    'LayerNorm.reset_parameters': 'Set the weight to ones and the bias to zeros.',
    'GroupNorm.reset_parameters': 'Set the weight to ones and the bias to zeros.',
    'CommandLine.error': "argparse's error, printed as one line, with exit code 2.",
}
OBJECT_DIRECTIVES = {'function', 'class', 'exception', 'data', 'method', 'property'}


class Notebook:
    "A course notebook as the site shows it: its title, summary, and the module it exports."

    def __init__(self, path: Path):
        cells = json.loads(path.read_text(encoding='utf-8'))['cells']
        first = ''.join(cells[0]['source']) if cells and cells[0]['cell_type'] == 'markdown' else ''
        title = re.search(r'^#\s+(.+)$', first, re.M)
        summary = re.search(r'^>\s*(.+)$', first, re.M)
        if not title:
            raise ValueError(
                f"{path.name}: the first cell must be a markdown cell starting with a '# title'"
            )
        self.path, self.title, self.summary = (
            path,
            title[1].strip(),
            summary[1].strip() if summary else '',
        )
        exp = re.search(
            r'^#\|\s*default_exp\s+(\S+)',
            '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'code'),
            re.M,
        )
        self.module = f'exp.{exp[1]}' if exp else None


# ---------------- the API reference, from the package itself


class _Raw(str):
    """An annotation as the source wrote it (the modules use `from __future__ import annotations`):
    shown without quotes."""

    def __repr__(self):
        return str(self)


def _shown(p: inspect.Parameter) -> inspect.Parameter:
    """A parameter with its annotation unquoted and a function or class default shown by name, not
    `<function f at 0x...>`."""
    if isinstance(p.annotation, str):
        p = p.replace(annotation=_Raw(p.annotation))
    if p.default is not p.empty and (inspect.isfunction(p.default) or isinstance(p.default, type)):
        p = p.replace(default=_Raw(p.default.__qualname__))
    return p


def signature(obj, method: bool = False) -> str:
    """`obj`'s signature as written in its source; with `method`, without its first parameter
    (self or cls, however named and annotated: a function patched onto a class takes
    `self: Cls`)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return '()'
    params = [_shown(p) for p in sig.parameters.values()][1 if method else 0 :]
    ret = sig.return_annotation
    sig = sig.replace(
        parameters=params, return_annotation=_Raw(ret) if isinstance(ret, str) else ret
    )
    return str(sig)


def docstring(obj) -> str:
    "`obj`'s own docstring (a class without one does not borrow its base class's)."
    doc = obj.__dict__.get('__doc__') if isinstance(obj, type) else getattr(obj, '__doc__', None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ''


def _first_line(doc: str) -> str:
    "The first paragraph of `doc`, on one line."
    return ' '.join(doc.split('\n\n')[0].split())


def _comment(lines: list[str], i: int) -> str:
    "The comment on line `i` of a source, or the comment lines right above it."
    own = re.search(r'#\s*(.+)$', lines[i]) if '#' in lines[i].split('=', 1)[-1] else None
    if own:
        return own[1].strip()
    above = []
    while i > 0 and lines[i - 1].strip().startswith('#') and not lines[i - 1].startswith('# %%'):
        i -= 1
        above.insert(0, lines[i].strip().lstrip('#').strip())
    return ' '.join(above)


def constant_doc(module, name: str, seen: frozenset = frozenset()) -> str:
    """The comment the source puts on, or right above, the line that assigns `name` in `module`;
    for a name `module` imports from a sibling (a re-export, `from .runs import PARTIAL`), that
    one's."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return ''
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf'{re.escape(name)}\s*(:[^=]*)?=', line):
            text = _comment(lines, i)
            return text[0].upper() + text[1:] + ('' if text.endswith('.') else '.') if text else ''
    # nbdev makes a one-line import relative; one over several lines, or indented (in a try), keeps
    # `exp.` in front
    imports = re.findall(r'^\s*from (?:\.|exp\.)(\w+) import (?:\(([^)]*)\)|(.*)$)', source, re.M)
    for sibling, *names in imports:
        target = f'{module.__package__}.{sibling}'
        if name in re.findall(r'\w+', ' '.join(names)) and target not in seen:
            return constant_doc(importlib.import_module(target), name, seen | {module.__name__})
    return ''


def describe(key: str, doc: str, name: str = '', cls: type | None = None) -> str:
    """The description of an entry of the reference: its docstring; else, for an event handler,
    when it runs; else the docstring of the method it overrides; else the line DESCRIPTIONS
    gives `key`; else ''."""
    if doc:
        return doc
    if name in EVENT_DOCS:
        return EVENT_DOCS[name]
    for base in cls.__mro__[1:] if cls else ():
        if name in base.__dict__ and (inherited := docstring(_function(base.__dict__[name]))):
            return f'As `{base.__qualname__}.{name}`: {_first_line(inherited)}'
    return DESCRIPTIONS.get(key, '')


def _function(value):
    "The function behind a method, a static or class method, or a property."
    return _getter(value) or getattr(value, '__func__', value)


def _getter(value):
    """The function behind a property or a cached_property (computed once, then a plain attribute);
    else None."""
    return (
        value.fget
        if isinstance(value, property)
        else value.func
        if isinstance(value, cached_property)
        else None
    )


def _own_members(cls: type, module: str) -> list[tuple[str, object]]:
    """The public methods and properties `cls` defines in `module` (its own body, or patched onto it
    there)."""
    members = []
    for name, value in cls.__dict__.items():
        if name.startswith('_'):
            continue
        fn = _getter(value) or getattr(value, '__func__', value)
        if inspect.isfunction(fn) and fn.__module__ == module:
            members.append((name, value))
    return members


def _directive(
    kind: str,
    name: str,
    sig: str,
    doc: str,
    module: str,
    fence: str = '```',
    body: str = '',
    options: str = '',
) -> str:
    head = f"{fence}{{py:{kind}}} {name}{sig}\n:module: {module}\n{options}"
    return head + (f"\n{doc}\n" if doc else '') + (f"\n{body}" if body else '') + f"{fence}\n"


def _member(cls: type, name: str, value, module: str, patched: bool = False) -> str:
    "One method or property of `cls`; `patched` for one added to it from another module."
    full = f'{cls.__name__}.{name}' if patched else name
    doc = describe(f'{cls.__name__}.{name}', docstring(_function(value)), name, cls)
    UNDESCRIBED.extend([f'{module}.{cls.__name__}.{name}'] if not doc else [])
    if _getter(value):
        return _directive('property', full, '', doc, module)
    fn = getattr(value, '__func__', value)
    sig = signature(fn, method=not isinstance(value, staticmethod))
    kind = (
        'method'
        if not isinstance(value, (staticmethod, classmethod))
        else 'staticmethod'
        if isinstance(value, staticmethod)
        else 'classmethod'
    )
    return _directive(kind, full, sig, doc, module)


# the entries of the reference written without a description (the build fails if any)
UNDESCRIBED: list[str] = []


def _value(obj) -> str:
    "A constant's value, or its type where the value is too long to show."
    text = repr(obj)
    return (
        f':value: {text}\n'
        if len(text) <= 80 and '\n' not in text
        else f':type: {type(obj).__name__}\n'
    )


def module_page(nb: Notebook, patched: dict[type, list[tuple[str, object]]]) -> str:
    """The reference page of `nb.module`: every name in its `__all__`, then what it patches onto
    earlier classes."""
    mod = importlib.import_module(nb.module)
    parts = [
        f"# {nb.module}\n",
        f"{nb.summary}\n" if nb.summary else '',
        f"Built in notebook [{nb.title}](../nbs/{nb.path.stem}.ipynb).\n",
        f"```{{py:module}} {nb.module}\n:no-index:\n```\n",
    ]
    for name in mod.__all__:
        obj = getattr(mod, name)
        doc = describe(name, docstring(obj) if callable(obj) else constant_doc(mod, name) or '')
        UNDESCRIBED.extend([f'{nb.module}.{name}'] if not doc else [])
        if home := reexported_from(nb.module, obj):
            # documented where it is defined; here a pointer, out of the index (one target each)
            kind = 'class' if isinstance(obj, type) else 'function'
            note = f'Re-exported from [`{home}`]({home}.md). {_first_line(doc)}'
            parts.append(_directive(kind, name, '', note, nb.module, options=':no-index:\n'))
        elif isinstance(obj, type):
            kind = 'exception' if issubclass(obj, BaseException) else 'class'
            members = ''.join(
                _member(obj, n, v, nb.module) for n, v in _own_members(obj, nb.module)
            )
            parts.append(
                _directive(
                    kind,
                    name,
                    signature(obj) if kind == 'class' else '',
                    doc,
                    nb.module,
                    '````',
                    members,
                )
            )
        elif callable(obj):
            parts.append(_directive('function', name, signature(obj), doc, nb.module))
        else:
            parts.append(_directive('data', name, '', doc, nb.module, options=_value(obj)))
    for cls, members in patched.items():
        parts.append(f"## Added to `{cls.__module__}.{cls.__name__}`\n")
        parts += [_member(cls, n, v, nb.module, patched=True) for n, v in members]
    return '\n'.join(p for p in parts if p)


def reference_pages(nbs: list[Notebook]) -> dict[str, str]:
    """Page name -> text for each exporting notebook's module, imported in course order (a later
    module may patch a class)."""
    pages, classes = {}, []
    for nb in nbs:
        if nb.module is None:
            continue
        mod = importlib.import_module(nb.module)
        patched = {
            cls: m
            for cls in classes
            if cls.__module__ != nb.module and (m := _own_members(cls, nb.module))
        }
        pages[nb.module] = module_page(nb, patched)
        classes += [o for o in map(mod.__dict__.get, mod.__all__) if isinstance(o, type)]
    return pages


def reexported_from(modname: str, obj) -> str | None:
    "The exp module that defines the class or function `obj`, if `modname` only re-exports it."
    home = getattr(obj, '__module__', None)
    if not (isinstance(obj, type) or inspect.isfunction(obj)) or not isinstance(home, str):
        return None
    return home if home.startswith('exp.') and home != modname else None


def exported_names() -> set[str]:
    """Every name the package exports: each module's `__all__`, and the public methods nbdev lists
    as patched onto a class."""
    from exp._modidx import d

    names = set()
    for modname, syms in d['syms'].items():
        module = importlib.import_module(modname)
        names |= {
            f'{modname}.{n}'
            for n in module.__all__
            if not reexported_from(modname, getattr(module, n))
        }
        names |= {
            s
            for s in syms
            if len(s.split('.')) == 4 and not any(p.startswith('_') for p in s.split('.')[2:])
        }
    return names


def documented_names(html: Path) -> set[str]:
    "The Python objects the built site documents, from Sphinx's inventory."
    from sphinx.util.inventory import InventoryFile

    with open(html / 'objects.inv', 'rb') as f:
        inv = InventoryFile.load(f, '', lambda *a: '/'.join(a))
    return {
        name
        for kind, entries in inv.items()
        if kind.split(':')[-1] in OBJECT_DIRECTIVES
        for name in entries
    }


# ---------------- the book


def guides() -> list[str]:
    "The guides, docs/*.md but the home page, in the order of GUIDES, then any other by name."
    found = {p.stem for p in DOCS.glob('*.md')} - {'index'}
    return [g for g in GUIDES if g in found] + sorted(found - set(GUIDES))


def toc(nbs: list[Notebook], modules: list[str]) -> str:
    """The book's table of contents: the lessons, the engineering appendix, the guides (with the
    benchmarks and their history), the API reference."""
    lines = ['format: jb-book', 'root: index', 'parts:']
    for caption, part in (('The course', lessons(nbs)), ('Engineering appendix', appendix(nbs))):
        if part:
            lines += [f'  - caption: {caption}', '    chapters:']
            lines += [f'      - file: nbs/{nb.path.stem}' for nb in part]
    lines += ['  - caption: Guides', '    chapters:'] + [
        f'      - file: docs/{g}' for g in guides()
    ]
    lines += ['      - file: bench/README', '        sections:']
    lines += [
        f'          - file: bench/results/{p.stem}' for p in sorted(BENCH.glob('results/*.md'))
    ]
    lines += ['  - caption: API reference', '    chapters:'] + [
        f'      - file: api/{m}' for m in modules
    ]
    return '\n'.join(lines) + '\n'


def lessons(nbs: list[Notebook]) -> list[Notebook]:
    "The lessons: every notebook but the appendix's."
    return [nb for nb in nbs if not is_appendix(nb.path)]


def appendix(nbs: list[Notebook]) -> list[Notebook]:
    "The engineering appendix's notebooks (`A<n>_topic.ipynb`)."
    return [nb for nb in nbs if is_appendix(nb.path)]


def _row(nb: Notebook) -> str:
    return (
        f"| [{nb.title}](nbs/{nb.path.stem}.ipynb) | {nb.summary} | "
        + (f"[`{nb.module}`](api/{nb.module}.md)" if nb.module else '')
        + ' |'
    )


HEADER = ['| notebook | what it builds | module |', '|---|---|---|']


def notebook_table(nbs: list[Notebook]) -> str:
    "A markdown table of `nbs`: title (a link), what it builds, its module (a link)."
    return '\n'.join([*HEADER, *map(_row, nbs)])


def index_page(nbs: list[Notebook]) -> str:
    "docs/index.md with its two tables filled in: the lessons, and the appendix."
    text = (DOCS / 'index.md').read_text(encoding='utf-8')
    text = text.replace('{{ lessons }}', notebook_table(lessons(nbs)))
    return text.replace('{{ appendix }}', notebook_table(appendix(nbs)))


DIRECTIVE_RE = re.compile(r'^#\|.*(\n|$)', re.M)


def without_directives(nb: dict) -> dict:
    """`nb` without nbdev's directive lines (`#| export`, `#| slow`, ...) in its code cells: they
    steer nbdev and the tests, not the reader. A cell left empty, with no output, is dropped."""
    cells = []
    for cell in nb['cells']:
        if cell['cell_type'] == 'code':
            source = DIRECTIVE_RE.sub('', ''.join(cell['source']))
            if not source.strip() and not cell.get('outputs'):
                continue
            cell = {**cell, 'source': source.strip('\n')}
        cells.append(cell)
    return {**nb, 'cells': cells}


def assemble(src: Path) -> list[str]:
    "Write the book's source tree into `src`; returns the modules it documents."
    nbs = [Notebook(p) for p in notebooks(NBS)]
    shutil.rmtree(src, ignore_errors=True)
    for folder in ('nbs', 'api', 'docs', 'bench/results', '_static'):
        (src / folder).mkdir(parents=True)
    for name in ('conf.py', 'favicon.png', 'custom.css'):
        shutil.copy(DOCS / name, src / ('_static' if name.endswith('.css') else '') / name)
    for path in [*DOCS.glob('*.md'), *DOCS.glob('*.png')]:
        if path.name == 'lessons.md':  # its table counts the notebooks as they are now
            text = path.read_text(encoding='utf-8')
            (src / 'docs' / path.name).write_text(
                text.replace('{{ lesson_sizes }}', markdown_table()), encoding='utf-8'
            )
        elif path.name != 'index.md':
            shutil.copy(path, src / 'docs' / path.name)
    shutil.copy(BENCH / 'README.md', src / 'bench' / 'README.md')
    for path in BENCH.glob('results/*.md'):
        shutil.copy(path, src / 'bench' / 'results' / path.name)
    for nb in nbs:
        text = json.dumps(without_directives(json.loads(nb.path.read_text(encoding='utf-8'))))
        (src / 'nbs' / nb.path.name).write_text(text, encoding='utf-8')
    UNDESCRIBED.clear()
    pages = reference_pages(nbs)
    for module, text in pages.items():
        (src / 'api' / f'{module}.md').write_text(text, encoding='utf-8')
    (src / 'index.md').write_text(index_page(nbs), encoding='utf-8')
    (src / '_toc.yml').write_text(toc(nbs, list(pages)), encoding='utf-8')
    return list(pages)


def site_pages(html: Path) -> list[Path]:
    "The pages of the built site at `html`: its HTML files, in the order of their paths."
    return sorted(html.rglob('*.html'))


def build(out: Path) -> Path:
    "Assemble and build the site under `out`; returns the folder of its HTML pages."
    t0 = time.perf_counter()
    src = out / 'src'
    assemble(src)
    if UNDESCRIBED:
        raise SystemExit(
            f'tools.site: {len(UNDESCRIBED)} entr(y/ies) of the API reference without a '
            f'description (a docstring, or a line in DESCRIPTIONS): {", ".join(UNDESCRIBED)}'
        )
    html = out / 'html'
    shutil.rmtree(html, ignore_errors=True)
    cmd = [
        sys.executable,
        '-m',
        'sphinx',
        '-b',
        'html',
        '-W',
        '--keep-going',
        '-q',
        '-d',
        str(out / 'doctrees'),
        str(src),
        str(html),
    ]
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(
            f'tools.site: the build failed (exit {proc.returncode}); see the warnings above'
        )
    missing = sorted(exported_names() - documented_names(html))
    if missing:
        raise SystemExit(
            f'tools.site: the API reference lacks {len(missing)} exported name(s): '
            f'{", ".join(missing)}'
        )
    # the theme's Jinja macros, copied with its static files: templates, not pages
    for macros in (html / '_static').glob('*macros.html'):
        macros.unlink()
    pages = site_pages(html)
    (out / 'pages.txt').write_text(
        ''.join(f'{p.relative_to(html).as_posix()}\n' for p in pages), encoding='utf-8'
    )
    print(
        f'site built in {time.perf_counter() - t0:.0f} s: {len(pages)} pages in '
        f'{html.relative_to(ROOT) if html.is_relative_to(ROOT) else html}, every entry of the API '
        'reference described'
    )
    return html


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m tools.site', description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        '--out', type=Path, default=ROOT / '_site', help='build folder (default: _site)'
    )
    args = parser.parse_args(argv)
    build(args.out.resolve())
    return 0


if __name__ == '__main__':
    sys.exit(main())

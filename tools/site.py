"""Build the course website: the notebooks with their committed outputs, in course order, and an API
reference of every exported name, with Jupyter Book 1's stack (Sphinx, myst-nb, sphinx-book-theme).
Nothing is executed.

Usage: python -m tools.site [--out _site]        (the pages land in OUT/html)

The source tree is assembled in OUT/src: docs/conf.py, docs/index.md with a table of the notebooks,
the notebooks from nbs/, a table of contents in the notebooks' order, and one reference page per
module, generated from the package. Any Sphinx warning fails the build, and so does an exported name
missing from the built reference.
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

from tools.notebooks import NBS, ROOT, is_appendix, notebooks

DOCS = ROOT / 'docs'
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


def signature(obj) -> str:
    "`obj`'s signature as written in its source."
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return '()'
    params = [_shown(p) for p in sig.parameters.values()]
    ret = sig.return_annotation
    sig = sig.replace(
        parameters=params, return_annotation=_Raw(ret) if isinstance(ret, str) else ret
    )
    return str(sig)


def docstring(obj) -> str:
    "`obj`'s own docstring (a class without one does not borrow its base class's)."
    doc = obj.__dict__.get('__doc__') if isinstance(obj, type) else getattr(obj, '__doc__', None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ''


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


def _member(cls_name: str | None, name: str, value, module: str) -> str:
    "One method or property; `cls_name` set for one patched onto a class from another module."
    full = f'{cls_name}.{name}' if cls_name else name
    if _getter(value):
        return _directive('property', full, '', docstring(_getter(value)), module)
    fn = getattr(value, '__func__', value)
    sig = re.sub(r'^\(self(, )?', '(', signature(fn))  # a method's signature without `self`
    kind = (
        'method'
        if not isinstance(value, (staticmethod, classmethod))
        else 'staticmethod'
        if isinstance(value, staticmethod)
        else 'classmethod'
    )
    return _directive(kind, full, sig, docstring(fn), module)


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
        if isinstance(obj, type):
            kind = 'exception' if issubclass(obj, BaseException) else 'class'
            members = ''.join(
                _member(None, n, v, nb.module) for n, v in _own_members(obj, nb.module)
            )
            parts.append(
                _directive(
                    kind,
                    name,
                    signature(obj) if kind == 'class' else '',
                    docstring(obj),
                    nb.module,
                    '````',
                    members,
                )
            )
        elif callable(obj):
            parts.append(_directive('function', name, signature(obj), docstring(obj), nb.module))
        else:
            parts.append(_directive('data', name, '', '', nb.module, options=_value(obj)))
    for cls, members in patched.items():
        parts.append(f"## Added to `{cls.__module__}.{cls.__name__}`\n")
        parts += [_member(cls.__name__, n, v, nb.module) for n, v in members]
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


def exported_names() -> set[str]:
    """Every name the package exports: each module's `__all__`, and the public methods nbdev lists
    as patched onto a class."""
    from exp._modidx import d

    names = set()
    for modname, syms in d['syms'].items():
        names |= {f'{modname}.{n}' for n in importlib.import_module(modname).__all__}
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


def toc(nbs: list[Notebook], modules: list[str]) -> str:
    "The book's table of contents: the lessons, the engineering appendix, the API reference."
    lines = ['format: jb-book', 'root: index', 'parts:']
    for caption, part in (('The course', lessons(nbs)), ('Engineering appendix', appendix(nbs))):
        if part:
            lines += [f'  - caption: {caption}', '    chapters:']
            lines += [f'      - file: nbs/{nb.path.stem}' for nb in part]
    lines += ['  - caption: API reference', '    chapters:'] + [
        f'      - file: api/{m}' for m in modules
    ]
    return '\n'.join(lines) + '\n'


def lessons(nbs: list[Notebook]) -> list[Notebook]:
    return [nb for nb in nbs if not is_appendix(nb.path)]


def appendix(nbs: list[Notebook]) -> list[Notebook]:
    return [nb for nb in nbs if is_appendix(nb.path)]


def notebook_table(nbs: list[Notebook]) -> str:
    "A markdown table of `nbs`: title (a link), what it builds, its module (a link)."
    rows = [
        f"| [{nb.title}](nbs/{nb.path.stem}.ipynb) | {nb.summary} | "
        + (f"[`{nb.module}`](api/{nb.module}.md)" if nb.module else '')
        + ' |'
        for nb in nbs
    ]
    return '\n'.join(['| notebook | what it builds | module |', '|---|---|---|', *rows])


def index_page(nbs: list[Notebook]) -> str:
    "docs/index.md with its two tables filled in: the lessons, and the appendix."
    text = (DOCS / 'index.md').read_text(encoding='utf-8')
    text = text.replace('{{ lessons }}', notebook_table(lessons(nbs)))
    return text.replace('{{ appendix }}', notebook_table(appendix(nbs)))


def assemble(src: Path) -> list[str]:
    "Write the book's source tree into `src`; returns the modules it documents."
    nbs = [Notebook(p) for p in notebooks(NBS)]
    shutil.rmtree(src, ignore_errors=True)
    (src / 'nbs').mkdir(parents=True)
    (src / 'api').mkdir()
    for name in ('conf.py', 'favicon.png'):
        shutil.copy(DOCS / name, src / name)
    for nb in nbs:
        shutil.copy(nb.path, src / 'nbs' / nb.path.name)
    pages = reference_pages(nbs)
    for module, text in pages.items():
        (src / 'api' / f'{module}.md').write_text(text, encoding='utf-8')
    (src / 'index.md').write_text(index_page(nbs), encoding='utf-8')
    (src / '_toc.yml').write_text(toc(nbs, list(pages)), encoding='utf-8')
    return list(pages)


def build(out: Path) -> Path:
    "Assemble and build the site under `out`; returns the folder of its HTML pages."
    t0 = time.perf_counter()
    src = out / 'src'
    assemble(src)
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
    pages = sum(1 for _ in html.rglob('*.html'))
    print(
        f'site built in {time.perf_counter() - t0:.0f} s: {pages} pages in '
        f'{html.relative_to(ROOT) if html.is_relative_to(ROOT) else html}'
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

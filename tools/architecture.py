"""The library's structure as the code has it: which exp modules import which, in layers, and where
each of the Learner's methods comes from; the generated part of docs/architecture.md.

    python -m tools.architecture          # print the generated part
    python -m tools.architecture --write  # refresh it in docs/architecture.md
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import textwrap
from functools import cache

from tools.notebooks import ROOT

EXP = ROOT / 'exp'
PAGE = ROOT / 'docs' / 'architecture.md'
BEGIN = '<!-- made by python -m tools.architecture: begin -->'
END = '<!-- made by python -m tools.architecture: end -->'
SOURCE = re.compile(r'File to edit: \.\./nbs/(\w+)\.ipynb')


@cache
def notebook_of(module: str) -> str:
    "The notebook an exp module is exported from (its stem), from the module's header."
    m = SOURCE.search((EXP / f'{module}.py').read_text())
    return m[1] if m else '-'


@cache
def modules() -> tuple[str, ...]:
    "The exp modules exported from a notebook (not the package's own files)."
    return sorted(
        p.stem
        for p in EXP.glob('*.py')
        if not p.stem.startswith('_') and notebook_of(p.stem) != '-'
    )


@cache
def imports(module: str) -> frozenset[str]:
    "The exp modules `module` imports, anywhere in its code."
    tree, found = ast.parse((EXP / f'{module}.py').read_text()), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:  # from .x import y
                found.add(node.module.split('.')[0])
            elif node.level == 1:  # from . import x
                found.update(a.name for a in node.names)
            elif node.module and node.module.startswith('exp.'):
                found.add(node.module.split('.')[1])
            elif node.module == 'exp':
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split('.')[1] for a in node.names if a.name.startswith('exp.'))
    return frozenset(found & set(modules()) - {module})


def layers() -> list[list[str]]:
    """The modules in layers: each imports only modules of the layers before it (a cycle would
    leave modules over, and raise)."""
    graph = {m: imports(m) for m in modules()}
    done: set[str] = set()
    out = []
    while len(done) < len(graph):
        layer = sorted(m for m, deps in graph.items() if m not in done and deps <= done)
        if not layer:
            raise ValueError(f"an import cycle among {sorted(set(graph) - done)}")
        out.append(layer)
        done.update(layer)
    return out


def learner_methods() -> list[tuple[str, str, str]]:
    "Each public method and property of the whole Learner: its name, its module, its notebook."
    from exp.distributed import Learner  # the module that gives the Learner its last method

    rows = []
    for name, value in vars(Learner).items():
        if name.startswith('_'):
            continue
        func = value.fget if isinstance(value, property) else value
        func = getattr(func, 'func', func)  # functools.cached_property
        if not (inspect.isfunction(func) or isinstance(value, property)):
            continue
        module = func.__module__.removeprefix('exp.')
        rows.append((name, module, notebook_of(module)))
    return rows


def render() -> str:
    "The generated part of docs/architecture.md."
    lines = ['### The modules, in layers', '']
    lines += [
        'Each module imports only modules of the layers above it (made from the code by `python -m',
        'tools.architecture`; its notebook after the name, `→` what it imports).',
        '',
        '```text',
    ]
    for i, layer in enumerate(layers()):
        for module in layer:
            deps = ', '.join(sorted(imports(module)))
            name = f'{module} ({notebook_of(module)})'
            line = f"{i:>2}  {name:<36}{'→ ' + deps if deps else ''}".rstrip()
            lines += textwrap.wrap(line, 96, subsequent_indent=' ' * 42) or [line]
    lines += ['```', '', '### The Learner and the home of each method', '']
    lines += ['| method | module | notebook |', '|---|---|---|']
    lines += [f'| `{n}` | `exp.{m}` | {nb} |' for n, m, nb in learner_methods()]
    return '\n'.join(lines)


def refreshed(text: str) -> str:
    "`text` (the page) with its generated part made anew."
    if BEGIN not in text or END not in text:
        raise ValueError(f"{PAGE.name} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{render()}\n{END}{rest.split(END, 1)[1]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--write', action='store_true', help='refresh docs/architecture.md')
    if p.parse_args().write:
        PAGE.write_text(refreshed(PAGE.read_text()))
        print(f"wrote {PAGE.relative_to(ROOT)}")
    else:
        print(render())


if __name__ == '__main__':
    main()

"""Re-execute course notebooks on the CPU and write their outputs back, so that what a reader sees
is what the committed code prints.

Usage: python -m tools.outputs [NOTEBOOK ...]      (no names: every notebook in nbs/, in order)

Each notebook runs top to bottom in a fresh Jupyter kernel started in nbs/, as Run All does, every
cell included: `#| slow` cells need the full data sets (Fashion-MNIST, MNIST), `#| cuda` cells print
their one line (CUDA is hidden from the kernel). The runs are seeded and pinned: PYTHONHASHSEED=0,
two torch threads (waiting passively, so that a busy machine does not inflate the timings), and each
notebook's own `set_seed`. Then, in the outputs: memory addresses and machine paths are replaced
(the temporary folder by `<tmp>`, the data cache by `$EXP_DATA`, the repository by `<repo>`, the
home folder by `~`), PNGs are re-encoded smaller, each code cell's metadata records the fingerprint
of the source that produced them (`source_hash`, checked by tests/test_outputs.py), and the notebook
is written as `nbdev_clean` writes it. A notebook with a failing cell is reported and left as it
was.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from tools.notebooks import NBS, ROOT, SOURCE_KEY, notebooks, source_hash

# seconds: generous, the slowest cell (a full-MNIST epoch in fp16) takes well under a minute
CELL_TIMEOUT = 1200
# the CPU count of the machines the committed outputs come from: thread count changes the rounding
THREADS = '2'
# '<Runner at 0x7f...>' -> '<Runner>', as nbdev_clean does
ADDRESS_RE = re.compile(r' at 0x[0-9a-fA-F]{4,}')


def kernel_env() -> dict[str, str]:
    """The environment the notebooks run in: seeded, pinned to two threads, no GPU, the inline plot
    backend."""
    env = {k: v for k, v in os.environ.items() if k != 'MPLBACKEND'}  # Agg would swallow the plots
    env.update(
        PYTHONHASHSEED='0',
        OMP_NUM_THREADS=THREADS,
        MKL_NUM_THREADS=THREADS,
        CUDA_VISIBLE_DEVICES='',
        # idle OpenMP threads sleep instead of spinning: on a busy machine spinning threads
        # made the printed timings 10-30x too slow (an epoch of the trainer: 13-27 s instead
        # of 0.7 s); the numbers are the same
        OMP_WAIT_POLICY='PASSIVE',
    )
    return env


def path_replacements() -> list[tuple[re.Pattern, str]]:
    """What machine paths in the outputs become: the longest (most specific) path first, then
    temporary folders."""
    from exp.data import data_dir

    named = {
        str(data_dir()): '$EXP_DATA' if os.environ.get('EXP_DATA') else '~/.cache/exp',
        sysconfig.get_paths()['purelib']: '<site-packages>',
        sys.prefix: '<python>',
        str(ROOT): '<repo>',
        str(Path.home()): '~',
    }
    subs = [
        (re.compile(re.escape(path) + r'(?![\w.-])'), named[path])
        for path in sorted(named, key=len, reverse=True)
    ]
    tmp = {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
    # a temporary folder, whole
    subs += [(re.compile(re.escape(t) + r"/[^/\s'\"]+"), '<tmp>') for t in sorted(tmp)]
    # torch's log lines name their source relative to an entry of sys.path: 'torch/...' from a
    # virtual environment, 'site-packages/torch/...' from a Python whose standard library folder
    # holds its site-packages
    return subs + [(re.compile(r"(?<![\w/.-])site-packages/"), '')]


def scrub_text(text: str, subs) -> str:
    "`text` without memory addresses and machine paths."
    text = ADDRESS_RE.sub('', text)
    for pattern, name in subs:
        text = pattern.sub(name, text)
    return text


def shrink_png(b64: str) -> str:
    """The PNG re-encoded with a 256-colour palette: plots and digit grids look the same, at about
    half the bytes."""
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(b64)))
    out = io.BytesIO()
    img.convert('RGB').quantize(256, method=Image.Quantize.MEDIANCUT).save(
        out, 'PNG', optimize=True
    )
    smaller = out.getvalue()
    return base64.b64encode(smaller).decode() if len(smaller) < len(base64.b64decode(b64)) else b64


def _text(value) -> str:
    return ''.join(value) if isinstance(value, list) else value


def merge_streams(outputs: list) -> list:
    "Consecutive pieces of the same stream as one output, as Jupyter shows them."
    merged = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (
            out.output_type == 'stream'
            and prev is not None
            and prev.output_type == 'stream'
            and prev.name == out.name
        ):
            prev.text = _text(prev.text) + _text(out.text)
        else:
            merged.append(out)
    return merged


def tidy_outputs(nb, subs) -> None:
    """Merge streams, scrub every text output, shrink every PNG, and record each code cell's source
    fingerprint."""
    for cell in nb.cells:
        if cell.cell_type != 'code':
            continue
        cell.outputs = merge_streams(cell.outputs)
        for out in cell.outputs:
            if 'text' in out:
                out['text'] = scrub_text(_text(out['text']), subs)
            for mime, value in out.get('data', {}).items():
                if mime == 'image/png':
                    out['data'][mime] = shrink_png(_text(value))
                elif mime.startswith('text/'):
                    out['data'][mime] = scrub_text(_text(value), subs)
        cell.metadata[SOURCE_KEY] = source_hash(cell.source)


def execute(path: Path):
    """Run the notebook at `path` in a fresh kernel; returns the executed notebook (raises on a
    failing cell)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name='python3',
        record_timing=False,
        resources={'metadata': {'path': str(NBS)}},
    )
    client.execute(env=kernel_env())  # passed on to the kernel's process
    return nb


def write_clean(nb, path: Path) -> None:
    """Write `nb` to `path` as Jupyter saves it (text as lists of lines), then cleaned as
    `nbdev_clean` leaves it."""
    import json
    import nbformat
    from execnb.nbio import write_nb
    from nbdev.clean import clean_nb
    from nbdev.config import get_config

    cfg = get_config()
    nb = json.loads(nbformat.writes(nb))
    clean_nb(
        nb,
        allowed_metadata_keys=cfg.get('allowed_metadata_keys').split(),
        allowed_cell_metadata_keys=cfg.get('allowed_cell_metadata_keys').split(),
        clean_ids=cfg.clean_ids,
    )
    write_nb(nb, path)


def refresh(path: Path, subs) -> bool:
    """Re-execute one notebook and write it back; on a failing cell, report it and leave the file
    unchanged."""
    from nbclient.exceptions import CellExecutionError

    t0 = time.perf_counter()
    try:
        nb = execute(path)
    except CellExecutionError as e:
        print(f'{path.name}: FAILED, left unchanged\n{e}', file=sys.stderr)
        return False
    tidy_outputs(nb, subs)
    write_clean(nb, path)
    print(f'{path.name}: outputs refreshed in {time.perf_counter() - t0:.0f} s')
    return True


def resolve(names: list[str]) -> list[Path]:
    """The notebooks named (a path, a file name in nbs/, or a stem such as 03_minibatch_training);
    all if none."""
    if not names:
        return notebooks()
    found = []
    for name in names:
        cands = [Path(name), NBS / name, NBS / f'{name}.ipynb']
        path = next((c for c in cands if c.is_file() and c.suffix == '.ipynb'), None)
        if path is None:
            raise SystemExit(f'tools.outputs: error: no notebook {name!r} (looked in nbs/ too)')
        found.append(path.resolve())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m tools.outputs', description=__doc__.splitlines()[0]
    )
    parser.add_argument('notebooks', nargs='*', help='notebooks to refresh (default: all of nbs/)')
    args = parser.parse_args(argv)
    paths, subs = resolve(args.notebooks), path_replacements()
    failed = [p.name for p in paths if not refresh(p, subs)]
    if failed:
        print(f'failed: {" ".join(failed)}', file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

"""Run one notebook top to bottom in this process, as a learner would open it.

Usage: python tests/run_notebook.py NOTEBOOK [--skip FLAG ...]
Cells carrying `#| FLAG` for a skipped flag are not run. On failure, prints the notebook, the
failing cell and its traceback, and exits 1.
"""

import argparse
import sys
from pathlib import Path

from nbdev.test import test_nb

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument('notebook', type=Path)
parser.add_argument('--skip', nargs='*', default=[], help='cell flags to skip (slow, cuda)')
args = parser.parse_args()

ok, secs = test_nb(args.notebook.resolve(), skip_flags=args.skip, showerr=True)
print(
    f"{args.notebook.name}: {'passed' if ok else 'FAILED'} in {secs:.1f} s"
    + (f" (skipped cells flagged: {' '.join(args.skip)})" if args.skip else '')
)
sys.exit(0 if ok else 1)

"""The course's notebooks in order, lessons then appendix, and the fingerprint that ties a code
cell's outputs to its source."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
# A lesson is `NN_topic.ipynb`, or `NNx_topic.ipynb` for one slotted in between (02b comes after 02,
# before 03); the engineering appendix is `A<n>_topic.ipynb` (A1, A2, ..., A10), after every lesson.
NOTEBOOK_RE = re.compile(r'^(?:(\d\d)|A(\d+))([a-z]?)_\w+\.ipynb$')
# the code cell metadata key holding the fingerprint of the source its outputs came from (kept by
# nbdev_clean: settings.ini lists it in allowed_cell_metadata_keys)
SOURCE_KEY = 'source_hash'


def notebook_key(path: Path) -> tuple[int, int, str]:
    "Sort key: lessons (0) before the appendix (1), then the number, then the letter (none first)."
    m = NOTEBOOK_RE.match(Path(path).name)
    if not m:
        raise ValueError(
            f"{Path(path).name!r} is not a course notebook name (a lesson NN_topic.ipynb or "
            "NNx_topic.ipynb, an appendix notebook A<n>_topic.ipynb)"
        )
    return (0, int(m[1]), m[3]) if m[1] else (1, int(m[2]), m[3])


def is_appendix(path: Path) -> bool:
    "Whether the notebook at `path` belongs to the engineering appendix (`A<n>_topic.ipynb`)."
    return notebook_key(path)[0] == 1


def notebooks(folder: Path = NBS) -> list[Path]:
    "The course notebooks in `folder`: the lessons in a learner's order, then the appendix."
    return sorted(
        (p for p in Path(folder).glob('*.ipynb') if NOTEBOOK_RE.match(p.name)), key=notebook_key
    )


def source_hash(source: str | list[str]) -> str:
    "The fingerprint of a cell's source: the first 16 hex digits of its SHA-256."
    if isinstance(source, list):
        source = ''.join(source)
    return hashlib.sha256(source.encode('utf-8')).hexdigest()[:16]

"""The course's notebooks, in order, and the fingerprint that ties a code cell's outputs to its source."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
# `NN_topic.ipynb`, or `NNx_topic.ipynb` for a notebook slotted in between (02b comes after 02, before 03)
NOTEBOOK_RE = re.compile(r'^(\d\d)([a-z]?)_\w+\.ipynb$')
# the code cell metadata key holding the fingerprint of the source its outputs came from (kept by nbdev_clean:
# settings.ini lists it in allowed_cell_metadata_keys)
SOURCE_KEY = 'source_hash'


def notebook_key(path: Path) -> tuple[int, str]:
    "Sort key: the number, then the letter (none first)."
    m = NOTEBOOK_RE.match(Path(path).name)
    if not m: raise ValueError(f"{Path(path).name!r} is not a course notebook name (NN_topic.ipynb or NNx_topic.ipynb)")
    return int(m[1]), m[2]


def notebooks(folder: Path = NBS) -> list[Path]:
    "The course notebooks in `folder`, in the order a learner works through them."
    return sorted((p for p in Path(folder).glob('*.ipynb') if NOTEBOOK_RE.match(p.name)), key=notebook_key)


def source_hash(source: str | list[str]) -> str:
    "The fingerprint of a cell's source: the first 16 hex digits of its SHA-256."
    if isinstance(source, list): source = ''.join(source)
    return hashlib.sha256(source.encode('utf-8')).hexdigest()[:16]

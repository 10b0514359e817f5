"""Shared helpers for the benchmark scripts: the data they time on, and a median timer."""

import statistics
import time
from pathlib import Path

import torch

from exp.data import get_data, normalize

FASHION = Path('/usr/share/datasets/fashion-mnist')


def fashion_or_random():
    """Fashion-MNIST normalised (60,000 x 784) if installed, else random data of the same shape, and
    its name."""
    if (FASHION / 'train-images-idx3-ubyte.gz').is_file():
        x, y, xv, yv = get_data('fashion')
        mean, std = x.mean(), x.std()
        return normalize(x, mean, std), y, normalize(xv, mean, std), yv, 'fashion-mnist'
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(60000, 784, generator=g),
        torch.randint(0, 10, (60000,), generator=g),
        torch.randn(10000, 784, generator=g),
        torch.randint(0, 10, (10000,), generator=g),
        'random 60000x784',
    )


def median_times(*fns, repeats: int = 5, warmup: int = 1) -> list:
    """Median wall time in seconds of each of `fns`, run in turn (interleaved, so drift hits all
    alike)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def report(name: str, value, fmt: str = '.4g') -> None:
    print(f'{name}: {value:{fmt}}' if isinstance(value, float) else f'{name}: {value}')

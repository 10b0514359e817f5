"""Unit tests for exp.data, lesson 01: get_data on the embedded digits, normalize, set_seed,
show_images, and the names exp.data still offers from exp.download (tests/test_download.py tests
what exp.download builds)."""

import gzip
import importlib.resources
from pathlib import Path

import numpy as np
import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test

import exp.data as data
import exp.download as download
from exp.data import IDX_FILES, get_data, normalize, set_seed, show_images

# ---------------- the embedded data set


def test_mnist5k(cache, no_network):
    x_train, y_train, x_valid, y_valid = get_data()
    ft.test_eq(
        [t.shape for t in (x_train, y_train, x_valid, y_valid)],
        [(4000, 784), (4000,), (1000, 784), (1000,)],
    )
    ft.test_eq((x_train.dtype, y_train.dtype), (torch.float32, torch.int64))
    assert x_train.min() >= 0 and x_train.max() <= 1 and x_train.max() == 1
    ft.test_eq(torch.bincount(y_valid), torch.full((10,), 100))  # stratified
    ft.test_eq(torch.bincount(y_train), torch.full((10,), 400))
    # shuffled, not sorted by class as the source CSV was
    assert (y_train[:100] != y_train[0]).any() and (y_valid[:50] != y_valid[0]).any()
    # the split is a partition of the 5,000 digits: no image in both sets
    train_rows = {r.tobytes() for r in (x_train * 255).round().byte().numpy()}
    assert not any(r.tobytes() in train_rows for r in (x_valid * 255).round().byte().numpy())
    assert not cache.exists()  # read from the package: nothing fetched, nothing cached


def test_get_data_returns_the_embedded_files_read_by_hand():
    "The exported get_data returns what lesson 01's dozen-line reader returns, tensor for tensor."
    folder = Path(str(importlib.resources.files('exp') / 'mnist5k'))

    def by_hand(path: Path) -> torch.Tensor:
        raw = gzip.decompress(path.read_bytes())
        ndim = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], 'big') for i in range(ndim)]
        pixels = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)
        return torch.from_numpy(pixels.copy())

    x_train, y_train, x_valid, y_valid = [by_hand(folder / f'{stem}.gz') for stem in IDX_FILES]
    want = (
        x_train.reshape(len(x_train), -1).float() / 255,
        y_train.long(),
        x_valid.reshape(len(x_valid), -1).float() / 255,
        y_valid.long(),
    )
    for got, expected in zip(get_data(), want):
        ft.test_eq(got.dtype, expected.dtype)
        ft.test_eq(got, expected)
    ft.test_eq(get_data(flat=False)[0], x_train.float() / 255)


def test_unknown_name(cache):
    with pytest.raises(ValueError, match="name='cifar10'.*known: mnist5k, mnist, fashion"):
        get_data('cifar10')


# ---------------- helpers


def test_normalize():
    x = torch.rand(100, 784) * 3 + 2
    xn = normalize(x, x.mean(), x.std())
    ft.test_close(xn.mean(), 0.0, eps=1e-5)
    ft.test_close(xn.std(), 1.0, eps=1e-5)
    ft.test_close(normalize(x, torch.full((784,), 2.0), 3.0), (x - 2) / 3)
    for std in (0.0, float('nan'), float('inf'), torch.tensor([1.0, 0.0])):
        with pytest.raises(ValueError, match='std must be finite and non-zero'):
            normalize(x, 0.0, std)
    with pytest.raises(TypeError, match='mean and std must be numbers or tensors'):
        normalize(x, 0.0, None)


def test_set_seed():
    import random

    draws = []
    for _ in range(2):
        set_seed(7)
        draws.append((random.random(), np.random.rand(), torch.rand(3)))
    ft.test_eq(draws[0][:2], draws[1][:2])
    ft.test_eq(draws[0][2], draws[1][2])
    with pytest.raises(ValueError, match='seed'):
        set_seed(-1)
    with pytest.raises(ValueError, match='seed'):
        set_seed(1.5)


@pytest.mark.parametrize('shape', [(10, 784), (10, 28, 28), (10, 1, 28, 28)])
def test_show_images(shape):
    import matplotlib

    matplotlib.use('Agg')
    fig = show_images(torch.rand(shape), torch.arange(10), n=6, ncols=4)
    images = [ax for ax in fig.axes if ax.images]
    ft.test_eq(len(images), 6)
    ft.test_eq(images[5].get_title(), '5')
    ft.test_eq(images[0].images[0].get_array().shape, (28, 28))


def test_show_images_titles_by_class_name():
    import matplotlib

    matplotlib.use('Agg')
    names = ('zero', 'one', 'two')
    fig = show_images(torch.rand(3, 784), torch.tensor([2, 0, 1]), n=3, classes=names)
    ft.test_eq([ax.get_title() for ax in fig.axes if ax.images], ['two', 'zero', 'one'])


def test_show_images_bad_input():
    with pytest.raises(ValueError, match='square'):
        show_images(torch.rand(4, 783))
    with pytest.raises(ValueError, match=r'\(N, H\*W\)'):
        show_images(torch.rand(4, 3, 28, 28))
    with pytest.raises(ValueError, match='n and ncols'):
        show_images(torch.rand(4, 784), n=0)


def test_set_seed_takes_an_int64():
    set_seed(2**63 - 1)
    for bad in (2**63, True, -1):
        with pytest.raises(ValueError, match='seed must be an int from 0 to 2\\*\\*63 - 1'):
            set_seed(bad)


# ---------------- what exp.data offered before the download code moved to exp.download

# exp.data's __all__ before the split: each of them still imports from exp.data (but its exercise
# checks, check_idx_dims and check_normalize_valid, moved with every lesson's to exp.exercises)
OFFERED = [
    'MAX_SEED',
    'IDX_DTYPES',
    'IDX_FILES',
    'DATASETS',
    'KNOWN_DATA',
    'MNIST5K_SHA256',
    'show_images',
    'normalize',
    'set_seed',
    'parse_idx',
    'read_idx',
    'atomic_write',
    'write_idx',
    'DownloadError',
    'data_dir',
    'sha256sum',
    'download_file',
    'remove_stale_parts',
    'fetch_archive',
    'fetch_dataset',
    'load_idx_folder',
    'get_data',
    'summarize',
    'python_command',
    'cli_error',
    'CommandLine',
    'main',
]


def test_every_name_exp_data_offered_still_imports_from_it():
    ft.test_eq(sorted(set(OFFERED) - set(data.__all__)), [])
    for name in OFFERED:
        assert hasattr(data, name), name
    # the appendix's names are re-exported: the same objects (a monkeypatch of DATASETS reaches
    # both); exp.data keeps its own main, which calls exp.download's with show_images
    moved = [name for name in OFFERED if name in download.__all__ and name != 'main']
    assert 'download_file' in moved and 'DATASETS' in moved
    for name in moved:
        assert getattr(data, name) is getattr(download, name), name

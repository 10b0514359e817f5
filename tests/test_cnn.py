"""Unit tests for exp.cnn: batch transforms, device placement, the CNNs and the 3-vs-7 sample."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn

from exp.batchnorm import BatchNorm2d
from exp.callbacks import Callback, DataBunch, Learner, Runner, sort_callbacks
from exp.cnn import (
    BatchTransformXCallback,
    CudaCallback,
    DeviceCallback,
    Lambda,
    conv_layer,
    default_device,
    flatten,
    get_cnn_model,
    mnist_sample,
    simple_cnn,
    view_tfm,
)
from exp.data import DownloadError, set_seed
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device here')


def flat_data(n=64, bs=16):
    x, y = torch.randn(n, 784), torch.randint(0, 10, (n,))
    ds = Dataset(x, y)
    return DataBunch(DataLoader(ds, Sampler(ds, bs)), DataLoader(ds, Sampler(ds, bs)), c=10)


class Seen(Callback):
    _order = 50

    def begin_fit(self):
        self.shapes, self.devices = [], []

    def after_pred(self):
        self.shapes.append(tuple(self.xb.shape))
        self.devices.append(
            (self.xb.device.type, self.yb.device.type, next(self.model.parameters()).device.type)
        )


def test_view_tfm_and_batch_transform():
    tfm = view_tfm(1, 28, 28)
    ft.test_eq(tfm(torch.zeros(5, 784)).shape, (5, 1, 28, 28))
    ft.test_eq(tfm.__name__, 'view_1x28x28')
    with pytest.raises(ValueError, match='size must be positive ints'):
        view_tfm()
    with pytest.raises(TypeError, match='tfm must be callable'):
        BatchTransformXCallback('view')
    data = flat_data()
    run = Runner(cbs=[BatchTransformXCallback(tfm), Seen()])
    run.fit(1, Learner(data, get_cnn_model(data), lr=0.1))
    ft.test_eq(set(run.seen.shapes), {(16, 1, 28, 28)})  # training and validation batches alike


def test_device_callback_on_cpu():
    data = flat_data()
    run = Runner(cbs=[DeviceCallback('cpu'), BatchTransformXCallback(view_tfm(1, 28, 28)), Seen()])
    run.fit(1, Learner(data, get_cnn_model(data), lr=0.1))
    ft.test_eq(set(run.seen.devices), {('cpu', 'cpu', 'cpu')})
    ft.test_eq(DeviceCallback().device, default_device())
    mps = getattr(torch.backends, 'mps', None)
    expected = (
        'cuda'
        if torch.cuda.is_available()
        else 'mps'
        if mps is not None and mps.is_available()
        else 'cpu'
    )
    ft.test_eq(default_device().type, expected)


def test_the_device_runs_before_the_transform_whatever_the_numbers():
    # a subclass, and a number that says "before the device"
    class EarlyTransform(BatchTransformXCallback):
        _order = -7

    run = Runner(cbs=[EarlyTransform(view_tfm(1, 28, 28)), DeviceCallback('cpu')])
    ft.test_eq(
        [type(cb).__name__ for cb in sort_callbacks(run.cbs)],
        ['TrainEvalCallback', 'DeviceCallback', 'EarlyTransform'],
    )


def test_cuda_callback():
    "course-v3's CudaCallback: a DeviceCallback('cuda'); refused at once where there is no GPU."
    if torch.cuda.is_available():
        cb = CudaCallback()
        assert isinstance(cb, DeviceCallback) and cb.device == torch.device('cuda')
    else:
        with pytest.raises(RuntimeError, match='CudaCallback needs a CUDA GPU'):
            CudaCallback()


@cuda
def test_device_callback_on_cuda():
    data = flat_data()
    learn = Learner(data, get_cnn_model(data), lr=0.1, metrics=[accuracy])
    run = Runner(cbs=[DeviceCallback('cuda'), BatchTransformXCallback(view_tfm(1, 28, 28)), Seen()])
    run.fit(1, learn)
    ft.test_eq(set(run.seen.devices), {('cuda', 'cuda', 'cuda')})
    assert next(learn.model.parameters()).is_cuda


def test_get_cnn_model():
    model = get_cnn_model(DataBunch(None, None, c=7))
    ft.test_eq(model(torch.zeros(3, 1, 28, 28)).shape, (3, 7))
    ft.test_eq([m.out_channels for m in model if isinstance(m, nn.Conv2d)], [8, 16, 32, 32])


def test_lambda_and_flatten():
    layer = Lambda(flatten)
    ft.test_eq(layer(torch.zeros(2, 3, 4)).shape, (2, 12))
    assert 'flatten' in repr(layer)


def test_simple_cnn_matches_fastai_v1_layout():
    model = simple_cnn((1, 16, 16, 2))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    ft.test_eq(
        [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs],
        [
            (1, 16, (3, 3), (2, 2), (1, 1)),
            (16, 16, (3, 3), (2, 2), (1, 1)),
            (16, 2, (3, 3), (2, 2), (1, 1)),
        ],
    )
    assert all(c.bias is not None for c in convs)
    ft.test_eq(model(torch.zeros(4, 1, 28, 28)).shape, (4, 2))
    bn = simple_cnn((1, 8, 8, 3), kernel_szs=[5, 3, 3], strides=[1, 2, 2], bn=True)
    # not after the last layer (ours, exp.batchnorm)
    ft.test_eq(sum(isinstance(m, BatchNorm2d) for m in bn.modules()), 2)
    ft.test_eq(
        [c.bias is None for c in bn.modules() if isinstance(c, nn.Conv2d)], [True, True, False]
    )
    ft.test_eq(bn(torch.zeros(2, 1, 28, 28)).shape, (2, 3))
    ft.test_eq(len(conv_layer(3, 4, bn=True)), 3)


def test_simple_cnn_takes_torchs_batch_norm_until_08b_builds_ours():
    "Notebook 08's models take torch's batch norm (`norm`); the default is the series' own."
    set_seed(0)
    torchs = simple_cnn((1, 8, 8, 3), bn=True, norm=nn.BatchNorm2d)
    set_seed(0)
    ours = simple_cnn((1, 8, 8, 3), bn=True)
    ft.test_eq(
        [type(m) for m in torchs.modules() if isinstance(m, nn.BatchNorm2d)], [nn.BatchNorm2d] * 2
    )
    norms = [type(m) for m in ours.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    ft.test_eq(norms, [BatchNorm2d] * 2)
    ft.test_eq(list(torchs.state_dict()), list(ours.state_dict()))  # checkpoints load either way
    x = torch.randn(16, 1, 28, 28)
    ft.test_close(ours(x), torchs(x), eps=1e-5)
    ft.test_eq(type(conv_layer(3, 4, bn=True, norm=nn.BatchNorm2d)[2]), nn.BatchNorm2d)
    plain = simple_cnn((1, 8, 3), norm=nn.BatchNorm2d)  # without bn, no batch norm
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    with pytest.raises(TypeError, match="norm must be a layer class .*got 'bn'"):
        simple_cnn((1, 8, 3), bn=True, norm='bn')


def test_exp_cnn_does_not_import_the_batch_norm_of_a_later_lesson():
    "exp.cnn (notebook 08) imports exp.batchnorm (notebook 08b) only when its batch norm is used."
    code = (
        'import sys, exp.cnn; assert "exp.batchnorm" not in sys.modules; '
        'exp.cnn.simple_cnn((1, 4, 2), bn=True); assert "exp.batchnorm" in sys.modules'
    )
    subprocess.run([sys.executable, '-c', code], check=True, cwd=Path(__file__).parents[1])


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(actns=(1,)), 'at least two positive channel counts'),
        (dict(actns=(1, 0, 2)), 'at least two positive channel counts'),
        (dict(actns=(1, 16, 2), strides=[2]), 'need 2 entries'),
        (dict(actns=(1, 16, 2), kernel_szs=[3, 3, 3]), 'need 2 entries'),
        (dict(actns=(1, 16, 2), kernel_szs=[0, 3]), 'kernel_szs and strides must be positive ints'),
        (dict(actns=(1, 16, 2), kernel_szs=[-1, 3]), 'must be positive ints'),
        (dict(actns=(1, 16, 2), strides=[0, 1]), 'must be positive ints'),
        (dict(actns=(1, 16, 2), strides=[2.5, 1]), 'must be positive ints'),
        (dict(actns=(1, 16, 2), strides=[True, 1]), 'must be positive ints'),
    ],
)
def test_simple_cnn_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simple_cnn(**kwargs)


def test_mnist_sample_of_the_embedded_digits(tmp_path, monkeypatch):
    monkeypatch.setenv('EXP_DATA', str(tmp_path))
    data = mnist_sample(bs=32, name='mnist5k')
    ft.test_eq(data.c, 2)
    ft.test_eq((len(data.train_ds), len(data.valid_ds)), (800, 200))
    ft.test_eq(data.valid_ds.y.bincount(), torch.tensor([100, 100]))
    ft.test_close(data.train_ds.x.mean(), 0.0, eps=1e-4)
    ft.test_close(data.train_ds.x.std(), 1.0, eps=1e-4)
    xb, yb = next(iter(data.train_dl))
    ft.test_eq((xb.shape, yb.dtype), ((32, 1, 28, 28), torch.int64))
    assert data.train_dl.sampler.shuffle and not data.valid_dl.sampler.shuffle


@pytest.mark.slow
def test_mnist_sample_is_the_seeds_by_default():
    """fastai's MNIST_SAMPLE: MNIST's 3s and 7s, from get_data('mnist') (downloaded once into the
    cache)."""
    data = mnist_sample()
    ft.test_eq((len(data.train_ds), len(data.valid_ds)), (12396, 2038))
    ft.test_eq(data.train_ds.y.bincount(), torch.tensor([6131, 6265]))
    ft.test_eq(data.valid_ds.y.bincount(), torch.tensor([1010, 1028]))
    ft.test_eq(data.train_ds.x.shape[1:], (1, 28, 28))


def test_mnist_sample_without_network_says_what_to_do(cache, no_network, monkeypatch):
    monkeypatch.delenv('EXP_MNIST_MIRROR', raising=False)
    with pytest.raises(DownloadError) as info:
        mnist_sample()
    message = str(info.value)
    assert 'could not fetch' in message and 'train-images-idx3-ubyte.gz' in message  # the file
    assert 'The archive copy failed too' in message  # the pinned fallback was tried
    assert f'copy it into {cache / "mnist"}/' in message and 'path=' in message  # how to supply it
    # and what works offline
    assert 'mnist_sample(path=...)' in message and "mnist_sample(name='mnist5k')" in message
    assert not [p for p in cache.rglob('*') if p.is_file()]  # no half-written file left behind


def test_mnist_sample_from_a_folder_without_threes(tmp_path):
    from exp.data import IDX_FILES, write_idx

    for stem, t in zip(
        IDX_FILES,
        (
            torch.zeros(4, 28, 28, dtype=torch.uint8),
            torch.tensor([1, 2, 4, 5], dtype=torch.uint8),
            torch.zeros(2, 28, 28, dtype=torch.uint8),
            torch.tensor([3, 7], dtype=torch.uint8),
        ),
    ):
        write_idx(tmp_path / stem, t)
    with pytest.raises(ValueError, match='no 3s or 7s'):
        mnist_sample(path=tmp_path)


def test_simple_cnn_learns_the_sample(tmp_path, monkeypatch, capsys):
    # seed 42, simple_cnn((1,16,16,2)), SGD lr 0.2, bs 64, 5 epochs: 0.925 measured (seeds 0-8:
    # 0.93-0.97); threshold 0.9
    monkeypatch.setenv('EXP_DATA', str(tmp_path))
    set_seed(42)
    learn = Learner(
        mnist_sample(name='mnist5k'),
        simple_cnn((1, 16, 16, 2)),
        F.cross_entropy,
        lr=0.2,
        metrics=[accuracy],
    )
    run = Runner()
    run.fit(5, learn)
    assert run.avg_stats.valid_stats.avg_stats[1] >= 0.9

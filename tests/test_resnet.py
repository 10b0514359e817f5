"""Unit tests for exp.resnet: the convolution with batch norm, the residual block, global average
pooling, course22p2's ResNet, the summary through hooks, the exercises of notebook 13, and the dry
run of bench/bench_resnet.py (no timing is asserted)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn

import exp.learner  # noqa: F401 (it gives the Learner fit)
from exp.batchnorm import BatchNorm1d, BatchNorm2d
from exp.callbacks import DataBunch, Learner
from exp.data import set_seed
from exp.exercises import ExerciseError, check_conv_macs, check_resblock_params
from exp.hooks import GeneralRelu
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import AdamW
from exp.resnet import GlobalAvgPool, ResBlock, act_gr, conv, layer_stats, resnet, summary

ROOT = Path(__file__).resolve().parents[1]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_conv_is_conv_norm_act():
    layer = conv(3, 8)
    assert [type(m) for m in layer] == [nn.Conv2d, BatchNorm2d, GeneralRelu]
    assert layer[0].bias is None  # batch norm follows: no bias
    ft.test_eq(layer(torch.randn(2, 3, 28, 28)).shape, (2, 8, 14, 14))
    ft.test_eq(conv(3, 8, ks=5, stride=1)(torch.randn(2, 3, 9, 9)).shape, (2, 8, 9, 9))
    bare = conv(3, 8, act=None, norm=False)
    assert [type(m) for m in bare] == [nn.Conv2d] and bare[0].bias is not None
    assert conv(3, 8, bias=True)[0].bias is not None
    assert (act_gr().leak, act_gr().sub) == (0.1, 0.4)


@pytest.mark.parametrize(
    'call, message',
    [
        (lambda: conv(0, 8), 'ni must be an int >= 1, got 0'),
        (lambda: conv(3, 8, ks=2.0), 'ks must be an int >= 1, got 2.0'),
        (lambda: conv(3, 8, stride=True), 'stride must be an int >= 1, got True'),
        (lambda: ResBlock(8, 8, ks=2), 'ks must be odd, got 2'),
        (lambda: ResBlock(8, -1), 'nf must be an int >= 1, got -1'),
        (lambda: resnet(nfs=()), 'nfs must be a non-empty list or tuple of widths, got ()'),
        (lambda: resnet(nfs=(8, 0)), 'nfs[1] must be an int >= 1, got 0'),
        (lambda: resnet(extra=-1), 'extra must be an int >= 0, got -1'),
        (lambda: resnet(n_out=0), 'n_out must be an int >= 1, got 0'),
    ],
)
def test_refusals_name_the_argument(call, message):
    ft.test_fail(call, contains=message)


def test_act_must_be_callable():
    ft.test_fail(lambda: conv(3, 8, act='relu'), contains="act must be a callable", exc=TypeError)
    ft.test_fail(lambda: ResBlock(3, 8, act=1), contains="got 1", exc=TypeError)


@pytest.mark.parametrize(
    'ni, nf, stride, size, out_size',
    [(8, 8, 1, 7, 7), (8, 16, 2, 7, 4), (8, 16, 2, 28, 14), (16, 16, 2, 5, 3), (4, 8, 3, 7, 3)],
)
def test_resblock_shapes(ni, nf, stride, size, out_size):
    block = ResBlock(ni, nf, stride)
    ft.test_eq(block(torch.randn(2, ni, size, size)).shape, (2, nf, out_size, out_size))
    assert isinstance(block.idconv, nn.Identity) == (ni == nf)
    assert isinstance(block.pool, nn.Identity) == (stride == 1)


@pytest.mark.parametrize('ni, nf, stride', [(8, 8, 1), (8, 16, 1), (8, 16, 2), (8, 8, 2)])
def test_resblock_with_zero_bn_starts_as_its_identity_path(ni, nf, stride):
    set_seed(0)
    block = ResBlock(ni, nf, stride, zero_bn=True)
    x = torch.randn(4, ni, 9, 9)
    with torch.no_grad():
        for train in (True, False):
            block.train(train)
            ft.test_eq(block(x), block.act(block.idconv(block.pool(x))))
            assert not torch.equal(block.convs[0](x), torch.zeros_like(block.convs[0](x)))
    # the default keeps batch norm's weight at one: the convolutions do add something
    with torch.no_grad():
        plain = ResBlock(ni, nf, stride)
        assert not torch.allclose(plain(x), plain.act(plain.idconv(plain.pool(x))))


def test_resblock_forward_by_hand():
    set_seed(0)
    block = ResBlock(3, 6, stride=2).eval()
    x = torch.randn(2, 3, 8, 8)
    c1, c2 = block.convs[0], block.convs[1]
    y = F.conv2d(x, c1[0].weight, padding=1)
    bn = lambda y, m: F.batch_norm(y, m.running_mean, m.running_var, m.weight, m.bias, eps=m.eps)
    y = F.leaky_relu(bn(y, c1[1]), 0.1) - 0.4
    y = bn(F.conv2d(y, c2[0].weight, stride=2, padding=1), c2[1])
    ident = F.conv2d(
        F.avg_pool2d(x, 2, ceil_mode=True), block.idconv[0].weight, block.idconv[0].bias
    )
    with torch.no_grad():
        ft.test_close(block(x), F.leaky_relu(y + ident, 0.1) - 0.4, eps=1e-5)


def test_global_avg_pool_matches_torch():
    x = torch.randn(3, 5, 7, 6)
    ft.test_close(GlobalAvgPool()(x), F.adaptive_avg_pool2d(x, 1).flatten(1), eps=1e-6)
    ft.test_eq(GlobalAvgPool()(x).shape, (3, 5))


def test_resnet_is_course22p2s_model():
    set_seed(0)
    model = resnet()
    assert [type(m).__name__ for m in model] == ['ResBlock'] * 6 + [
        'GlobalAvgPool',
        'Linear',
        'BatchNorm1d',
    ]
    assert isinstance(model[-1], BatchNorm1d) and model[-2].bias is None
    # course22p2's 1,228,908 less the biases its convolutions keep before batch norm
    ft.test_eq(n_params(model), 1_227_900)
    ft.test_eq(n_params(model) + 2 * sum((8, 16, 32, 64, 128, 256)), 1_228_908)
    ft.test_eq(model(torch.randn(4, 1, 28, 28)).shape, (4, 10))
    ft.test_eq(resnet(n_in=3, n_out=7)(torch.randn(2, 3, 32, 32)).shape, (2, 7))
    deeper = resnet(nfs=(8, 16, 32), extra=2)
    ft.test_eq(len(deeper), 1 + 2 * 3 + 3)
    ft.test_eq(deeper(torch.randn(2, 1, 28, 28)).shape, (2, 10))


def test_resnet_uses_he_init_for_the_leak():
    set_seed(0)
    model = resnet(nfs=(64, 64))
    w = model[1].convs[0][0].weight  # fan in 64 * 3 * 3
    expected = (2 / (1 + 0.1**2) / (64 * 9)) ** 0.5
    ft.test_close(w.std().item(), expected, eps=expected * 0.05)
    zero = resnet(nfs=(8, 16), zero_bn=True)
    for block in zero[:2]:
        assert not block.convs[-1][1].weight.any() and block.convs[0][1].weight.all()


def test_summary_counts_every_parameter():
    set_seed(0)
    model = resnet()
    x = torch.randn(2, 1, 28, 28)
    rows = layer_stats(model, x)
    ft.test_eq(len(rows), len(model))
    ft.test_eq(sum(r['params'] for r in rows), n_params(model))
    ft.test_eq(rows[0]['input'], (2, 1, 28, 28))
    sizes = [(8, 28), (16, 14), (32, 7), (64, 4), (128, 2), (256, 1)]
    ft.test_eq([r['output'] for r in rows[:6]], [(2, nf, n, n) for nf, n in sizes])
    text = summary(model, x)
    assert f'{n_params(model):,}' in text.splitlines()[-2]
    assert text.splitlines()[0].split() == ['layer', 'output', 'params', 'MFLOPs']


def test_macs_of_a_conv_and_a_linear_by_hand():
    conv2 = nn.Conv2d(3, 16, 5, stride=2, padding=2)
    (row,) = layer_stats(conv2, torch.randn(2, 3, 28, 28))
    ft.test_eq(row['output'], (2, 16, 14, 14))
    ft.test_eq(row['macs'], 16 * 14 * 14 * (3 * 5 * 5))  # per image: outputs x taps
    grouped = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)
    ft.test_eq(layer_stats(grouped, torch.randn(1, 8, 6, 6))[0]['macs'], 8 * 36 * (2 * 9))
    lin = nn.Linear(20, 7)
    ft.test_eq(layer_stats(lin, torch.randn(5, 20))[0]['macs'], 20 * 7)
    ft.test_eq(layer_stats(lin, torch.randn(5, 3, 20))[0]['macs'], 3 * 20 * 7)
    # a block's count is its convolutions'; the first block of resnet() by hand
    block = resnet()[0]
    (row,) = layer_stats(nn.Sequential(block), torch.randn(2, 1, 28, 28))
    ft.test_eq(row['macs'], 28 * 28 * (8 * 1 * 9 + 8 * 8 * 9 + 8 * 1))


def test_layer_stats_leaves_the_model_as_it_was():
    set_seed(0)
    model = resnet(nfs=(8, 16))
    model.train()
    model[1].eval()
    bn = model[0].convs[0][1]
    before = bn.running_mean.clone(), bn.num_batches_tracked.clone()
    layer_stats(model, torch.randn(4, 1, 28, 28))
    ft.test_eq((bn.running_mean, bn.num_batches_tracked), before)
    assert model.training and model[0].training and not model[1].training
    assert not any(m._forward_hooks for m in model.modules())


def test_layer_stats_refusals():
    model = resnet(nfs=(8, 16))
    ft.test_fail(lambda: layer_stats(model, [1, 2]), contains='x must be a tensor', exc=TypeError)
    ft.test_fail(
        lambda: layer_stats('model', torch.zeros(1)), contains='model must be an nn.Module'
    )
    ft.test_fail(
        lambda: layer_stats(model, torch.randn(2, 1, 28, 28), [nn.ReLU()]),
        contains='not called: [\'ReLU\']',
    )


def test_a_training_step_lowers_the_loss():
    set_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    ds = Dataset(x, y)
    data = DataBunch(DataLoader(ds, Sampler(ds, 32)), DataLoader(ds, Sampler(ds, 64)), c=10)
    model = resnet(nfs=(8, 16, 32))
    learn = Learner(data, model, opt_func=AdamW, lr=1e-2)
    learn.display = 'off'
    loss = lambda: F.cross_entropy(model.eval()(x), y).item()
    with torch.no_grad():
        before = loss()
    learn.fit(3)
    with torch.no_grad():
        assert loss() < before - 0.1, (loss(), before)


def conv_macs(ni, nf, ks, h, w):
    return ni * nf * ks * ks * h * w


def resblock_params(ni, nf):
    return 9 * ni * nf + 9 * nf * nf + 4 * nf + (ni * nf + nf if ni != nf else 0)


@pytest.mark.parametrize(
    'check, answer, mistakes',
    [
        (
            check_conv_macs,
            conv_macs,
            [
                (lambda ni, nf, ks, h, w: nf * ks * ks * h * w, 'every input channel'),
                (lambda ni, nf, ks, h, w: ni * nf * ks * h * w, 'square ks'),
                (lambda ni, nf, ks, h, w: ni * nf * ks * ks, 'times h x w'),
                (lambda ni, nf, ks, h, w: (ni + 1) * nf * ks * ks * h * w, 'should be'),
                (lambda ni, nf, ks, h, w: float(conv_macs(ni, nf, ks, h, w)), 'should be an int'),
            ],
        ),
        (
            check_resblock_params,
            resblock_params,
            [
                (lambda ni, nf: 9 * ni * nf + 9 * nf * nf + 4 * nf, 'identity path has a 1x1'),
                (lambda ni, nf: resblock_params(ni, nf) - 4 * nf, 'followed by a batch norm'),
                (lambda ni, nf: resblock_params(ni, nf) + 2 * nf, 'has no bias'),
                (lambda ni, nf: resblock_params(ni, nf) - (ni != nf) * nf, '1x1 convolution has'),
                (lambda ni, nf: resblock_params(ni, nf) + 1, 'should be'),
            ],
        ),
    ],
)
def test_exercise_checks(check, answer, mistakes, capsys):
    check(answer)
    assert capsys.readouterr().out.strip().endswith('correct')
    for wrong, hint in mistakes:
        ft.test_fail(lambda: check(wrong), contains=hint, exc=ExerciseError)


def run_bench(*args):
    return subprocess.run(
        [sys.executable, 'bench/bench_resnet.py', *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': str(ROOT)},
        timeout=600,
    )


def test_bench_resnet_dry_run():
    "The benchmark runs end to end on a few small batches, both formats; it checks the runs agree."
    proc = run_bench('--batches', '2', '--valid-batches', '1', '--bs', '8', '--rounds', '1')
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(': ', 1) for line in proc.stdout.splitlines() if ': ' in line)
    assert (lines['train_images'], lines['valid_images'], lines['params']) == (
        '16',
        '16',
        '1227900',
    )
    assert float(lines['ratio']) > 0 and float(lines['hand_ms_per_batch']) > 0


def test_bench_resnet_help_and_refusals():
    proc = run_bench('--help')
    assert proc.returncode == 0 and '--channels-last' in proc.stdout and 'Goal' in proc.stdout
    proc = run_bench('--bs', '0')
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == 'bench_resnet.py: error: --bs must be >= 1, got 0'


def test_numpy_ints_are_widths_as_ints_are():
    # widths from an array are numbers.Integral: the same model as with Python ints, not a refusal
    set_seed(0)
    model = resnet(nfs=(np.int64(8), np.int64(16)), n_in=np.int64(1), n_out=np.int64(10))
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert isinstance(ResBlock(np.int64(8), np.int64(8)), ResBlock)

"""Unit tests for exp.batchnorm: BatchNorm1d, BatchNorm2d, LayerNorm and GroupNorm against
PyTorch's, and RunningBatchNorm against batch norm and the pooled statistics written out (its
exercises: test_exercises.py)."""

import copy
import math
import os
import shutil
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st
from torch import nn

import exp.batchnorm
import exp.kernels
from exp.batchnorm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RunningBatchNorm
from exp.data import set_seed

TOL = dict(rtol=1e-5, atol=1e-5)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device here')


def spread_affine(*modules):
    """Weights and biases away from 1 and 0 (the same in each module), so that a mix-up between them
    shows."""
    with torch.no_grad():
        for m in modules:
            if getattr(m, 'weight', None) is not None:
                m.weight.copy_(torch.linspace(0.5, 1.5, m.weight.numel()).view_as(m.weight))
            if getattr(m, 'bias', None) is not None:
                m.bias.copy_(torch.linspace(-0.3, 0.3, m.bias.numel()).view_as(m.bias))


def check_like_torch(
    ours, ref, shape, modes, seed=0, tol=TOL, dtype=torch.float32, scale=3.0, shift=1.0
):
    """Run `ours` and `ref` on the same batches in the given train (True) / eval (False) modes:
    outputs, gradients, buffers agree."""
    spread_affine(ours, ref)
    g = torch.Generator().manual_seed(seed)
    for training in modes:
        ours.train(training)
        ref.train(training)
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        torch.testing.assert_close(ya, yb, **tol)
        grad = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        ya.backward(grad)
        yb.backward(grad)
        torch.testing.assert_close(xa.grad, xb.grad, **tol)
        for name, p in ref.named_parameters():
            torch.testing.assert_close(getattr(ours, name).grad, p.grad, **tol)
        for name, b in ref.named_buffers():
            mine = getattr(ours, name)
            if b.is_floating_point():
                torch.testing.assert_close(mine, b, **tol)
            else:
                ft.test_eq(mine, b)
        ours.zero_grad()
        ref.zero_grad()


# ---------------- batch norm against torch's

BN_CASES = [
    (BatchNorm2d, nn.BatchNorm2d, (16, 6, 5, 5)),
    (BatchNorm1d, nn.BatchNorm1d, (32, 6)),
    (BatchNorm1d, nn.BatchNorm1d, (8, 6, 7)),
]


@pytest.mark.parametrize('ours, ref, shape', BN_CASES, ids=['2d', '1d_2D_input', '1d_3D_input'])
@pytest.mark.parametrize('momentum', [0.1, 0.5, None])
@pytest.mark.parametrize(
    'affine, track', [(True, True), (False, True), (True, False), (False, False)]
)
@pytest.mark.parametrize('kernel', [True, False], ids=['kernel', 'python_passes'])
def test_batchnorm_equals_torch(ours, ref, shape, momentum, affine, track, kernel):
    kw = dict(momentum=momentum, affine=affine, track_running_stats=track)
    a, b = ours(6, **kw), ref(6, **kw)
    a.kernel = kernel
    check_like_torch(a, b, shape, modes=[True, True, False, True, False, True])
    ft.test_eq(list(a.state_dict()), list(b.state_dict()))
    ft.test_eq([n for n, _ in a.named_parameters()], [n for n, _ in b.named_parameters()])


def large_mean_batches():
    """Channels whose mean is far larger than their spread: a constant 1e4 (no spread at all),
    1e6 +- 1, 1e4 +- 1e-3, 1e3 +- 0.1, and one of zero mean."""
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(32, 5, 14, 14, generator=g, dtype=torch.float64)
    mean = torch.tensor([1e4, 1e6, 1e4, 1e3, 0.0], dtype=torch.float64).view(1, 5, 1, 1)
    spread = torch.tensor([0.0, 1.0, 1e-3, 0.1, 1.0], dtype=torch.float64).view(1, 5, 1, 1)
    x = (mean + spread * noise).float()
    return x, torch.randn(x.shape, generator=g)


def bn_errors(bn, x, grad):
    """The largest errors of `bn`'s output, input gradient and running statistics, per channel,
    against torch's layer in float64 on the same float32 batch."""
    ref = nn.BatchNorm2d(x.shape[1]).double()
    xa, xb = x.clone().requires_grad_(), x.double().requires_grad_()
    ya, yb = bn(xa), ref(xb)
    ya.backward(grad)
    yb.backward(grad.double())
    per_channel = lambda a, b: (a.double() - b).abs().transpose(0, 1).flatten(1).amax(1)
    return (
        per_channel(ya.detach(), yb.detach()),
        per_channel(xa.grad, xb.grad),
        (bn.running_mean.double() - ref.running_mean).abs(),
        (bn.running_var.double() - ref.running_var).abs() / ref.running_var,
    )


@pytest.mark.parametrize('kernel', [True, False], ids=['kernel', 'python_passes'])
def test_a_mean_far_larger_than_the_spread_costs_no_more_precision_than_torchs(kernel):
    # a channel's sum taken as it comes, in float32, keeps few of the digits of its spread once the
    # mean is large, and x * (1/std) - mean/std cancels two numbers near 3e6 (the constant channel:
    # an output error of 0.25, torch's 0.027); ours are to be within torch's own float32 error
    x, grad = large_mean_batches()
    bn = BatchNorm2d(5)
    bn.kernel = kernel
    ours = bn_errors(bn, x, grad)
    theirs = bn_errors(nn.BatchNorm2d(5), x, grad)
    for what, mine, torchs in zip(
        ('output', 'input gradient', 'running mean', 'running var'), ours, theirs
    ):
        assert (mine <= torchs + 1e-5).all(), (what, mine.tolist(), torchs.tolist())


# The property tests run in float64, on any shape and scale: in float32 a batch whose mean is far
# larger than its spread (x ~ 1 +- 0.01) loses digits in torch's kernel and in ours alike, and their
# gradients then differ by more than 1e-5 although both are as good as float32 allows. The float32
# comparisons above use well-conditioned data.
F64 = dict(dtype=torch.float64)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 9),
    c=st.integers(1, 5),
    spatial=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    momentum=st.one_of(st.none(), st.floats(0, 1)),
    affine=st.booleans(),
    track=st.booleans(),
    modes=st.lists(st.booleans(), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    scale=st.floats(0.01, 100),
    shift=st.floats(-10, 10),
)
def test_batchnorm_equals_torch_on_any_shape(
    n, c, spatial, momentum, affine, track, modes, seed, scale, shift
):
    shape = (n, c, *spatial)
    ours, ref = (
        (BatchNorm2d, nn.BatchNorm2d) if len(spatial) == 2 else (BatchNorm1d, nn.BatchNorm1d)
    )
    kw = dict(momentum=momentum, affine=affine, track_running_stats=track, **F64)
    tol = dict(rtol=1e-9, atol=1e-9 * max(1.0, 1 / scale))  # the input's gradient scales as 1/scale
    check_like_torch(
        ours(c, **kw),
        ref(c, **kw),
        shape,
        modes,
        seed,
        tol=tol,
        dtype=torch.float64,
        scale=scale,
        shift=shift,
    )


def test_batchnorm_in_float64_to_1e_12():
    check_like_torch(
        BatchNorm2d(4).double(),
        nn.BatchNorm2d(4).double(),
        (8, 4, 3, 3),
        [True, True, False],
        tol=dict(rtol=1e-12, atol=1e-12),
        dtype=torch.float64,
    )
    bn = BatchNorm1d(4, dtype=torch.float64)
    ft.test_eq({p.dtype for p in bn.parameters()} | {bn.running_var.dtype}, {torch.float64})


def test_momentum_none_is_a_cumulative_average():
    bn = BatchNorm1d(3, momentum=None)
    batches = [torch.randn(10, 3) * (i + 1) + i for i in range(4)]
    for x in batches:
        bn(x)
    ft.test_eq(bn.num_batches_tracked, torch.tensor(4))
    torch.testing.assert_close(bn.running_mean, torch.stack([x.mean(0) for x in batches]).mean(0))
    # unbiased ones
    torch.testing.assert_close(bn.running_var, torch.stack([x.var(0) for x in batches]).mean(0))


def test_without_running_stats_eval_uses_the_batch():
    bn = BatchNorm2d(3, track_running_stats=False).eval()
    assert bn.running_mean is None and bn.num_batches_tracked is None
    x = torch.randn(5, 3, 4, 4) * 2 + 3
    y = bn(x)
    torch.testing.assert_close(y.mean((0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        y, F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, 1e-5), **TOL
    )


def test_momentum_zero_keeps_the_running_stats():
    bn = BatchNorm2d(3, momentum=0.0)
    bn(torch.randn(4, 3, 2, 2) + 5)
    ft.test_eq(bn.running_mean, torch.zeros(3))
    ft.test_eq(bn.num_batches_tracked, torch.tensor(1))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_inputs_are_normalised_in_fp32(dtype):
    ours, ref = BatchNorm2d(4), nn.BatchNorm2d(4)
    spread_affine(ours, ref)
    x = (torch.randn(16, 4, 5, 5) * 3 + 2).to(dtype)
    for training in (True, True, False):
        ours.train(training)
        ref.train(training)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        ft.test_eq(
            (ya.dtype, ours.weight.dtype, ours.running_var.dtype),
            (dtype, torch.float32, torch.float32),
        )
        eps = 1e-2 if dtype == torch.float16 else 5e-2  # the rounding of the output to its dtype
        torch.testing.assert_close(ya.float(), yb.float(), rtol=eps, atol=eps)
        ya.float().sum().backward()
        yb.float().sum().backward()
        ft.test_eq(xa.grad.dtype, dtype)
        torch.testing.assert_close(ours.running_mean, ref.running_mean, **TOL)
        torch.testing.assert_close(ours.running_var, ref.running_var, **TOL)


def test_backward_matches_finite_differences():
    for bn, shape in (
        (BatchNorm2d(3), (4, 3, 3, 2)),
        (BatchNorm1d(3), (5, 3)),
        (BatchNorm1d(3, affine=False), (4, 3, 2)),
    ):
        bn = bn.double()
        spread_affine(bn)
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, *params: bn(x), (x, *bn.parameters()))


def test_second_derivative_is_refused_not_wrong():
    x = torch.randn(4, 3, 3, 3, requires_grad=True)
    (gx,) = torch.autograd.grad(BatchNorm2d(3)(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match='once_differentiable'):
        gx.sum().backward()


@pytest.mark.parametrize('kernel', [True, False], ids=['kernel', 'python_passes'])
def test_momentum_none_never_reads_the_count_on_the_host(monkeypatch, kernel):
    # float(num_batches_tracked), as torch's module does, makes a GPU wait at every training batch
    bn = BatchNorm2d(3, momentum=None)
    bn.kernel = kernel

    def refuse(*args, **kwargs):
        raise AssertionError('a tensor value was read on the host')

    for name in ('item', 'tolist', '__float__', '__bool__', '__int__', '__index__'):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    bn(torch.randn(4, 3, 2, 2))
    monkeypatch.undo()
    ft.test_eq(bn.num_batches_tracked, torch.tensor(1))


# ---------------- the C++ kernel (exp.kernels, appendix notebook A4_speed), as the layers use it


def training_pass(bn, x):
    "The autograd Function that `bn` trains `x` with: the kernel's or the Python passes'."
    return type(bn.train()(x.requires_grad_()).grad_fn).__name__


@pytest.mark.skipif(
    shutil.which(os.environ.get('CXX', 'c++')) is None,
    reason='no C++ compiler here to build the kernel with',
)
def test_the_kernel_builds_where_there_is_a_compiler():
    assert exp.kernels.build_kernel() is not None
    ft.test_eq(
        training_pass(BatchNorm2d(4), torch.randn(8, 4, 3, 3)), '_KernelBatchNormFunctionBackward'
    )
    ft.test_eq(training_pass(BatchNorm1d(4), torch.randn(8, 4)), '_KernelBatchNormFunctionBackward')


@pytest.mark.parametrize(
    'make, x',
    [
        # float64: the Python passes
        (lambda: BatchNorm2d(4).double(), torch.randn(8, 4, 3, 3, dtype=torch.float64)),
        # a layout it does not read
        (lambda: BatchNorm2d(4), torch.randn(8, 4, 3, 3).to(memory_format=torch.channels_last)),
        (lambda: BatchNorm2d(4), torch.randn(8, 4, 3, 3)[:, :, :, :2]),  # not contiguous
    ],
    ids=['float64', 'channels_last', 'strided'],
)
def test_the_kernel_leaves_what_it_does_not_fit_to_the_python_passes(make, x):
    ft.test_eq(training_pass(make(), x), '_BatchNormFunctionBackward')


def test_the_switch_turns_the_kernel_off_for_one_layer_or_the_class(monkeypatch):
    bn, x = BatchNorm2d(4), torch.randn(8, 4, 3, 3)
    bn.kernel = False
    ft.test_eq(training_pass(bn, x), '_BatchNormFunctionBackward')
    monkeypatch.setattr(BatchNorm2d, 'kernel', False)
    ft.test_eq(training_pass(BatchNorm2d(4), x), '_BatchNormFunctionBackward')


@pytest.mark.parametrize('shape', [(16, 6, 5, 5), (32, 6), (8, 6, 7), (2, 1, 1, 1), (3, 5, 1)])
@pytest.mark.parametrize('affine, track', [(True, True), (False, False)])
def test_the_kernel_equals_the_python_passes(shape, affine, track):
    cls, kw = (
        BatchNorm2d if len(shape) == 4 else BatchNorm1d,
        dict(affine=affine, track_running_stats=track),
    )
    ours, python_passes = cls(shape[1], **kw), cls(shape[1], **kw)
    python_passes.kernel = False
    check_like_torch(ours, python_passes, shape, modes=[True, True, False])


def test_without_a_compiler_the_python_passes_run_and_a_warning_says_why(monkeypatch):
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError('Ninja is required to load C++ extensions (cut by the test)')

    monkeypatch.setattr(torch.utils.cpp_extension, 'load', no_compiler)
    # not tried yet: the next training batch tries
    monkeypatch.setattr(exp.kernels, '_kernel_ops', ...)
    with pytest.warns(
        UserWarning, match='the C.. kernel could not be built .RuntimeError: Ninja is required'
    ):
        ft.test_eq(
            training_pass(BatchNorm2d(4), torch.randn(8, 4, 3, 3)), '_BatchNormFunctionBackward'
        )
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # tried once: no second try, no second warning
        check_like_torch(BatchNorm2d(4), nn.BatchNorm2d(4), (8, 4, 3, 3), [True, False])
    ft.test_is(exp.kernels._kernel_ops, None)


@pytest.mark.parametrize(
    'age_s, removed', [(3600, True), (5, False)], ids=['killed_build', 'build_under_way']
)
def test_a_lock_left_by_a_killed_build_is_removed(monkeypatch, tmp_path, age_s, removed):
    import torch.utils.cpp_extension

    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    folder = exp.kernels._kernel_dir()
    folder.mkdir(parents=True)
    lock = folder / 'lock'
    lock.touch()
    os.utime(lock, (time.time() - age_s,) * 2)
    seen = []

    def load(**kwargs):
        seen.append(
            (lock.exists(), (folder / 'batchnorm.cpp').read_text(), kwargs['build_directory'])
        )

    monkeypatch.setattr(torch.utils.cpp_extension, 'load', load)
    monkeypatch.setattr(exp.kernels, '_kernel_ops', ...)
    exp.kernels.build_kernel()
    ft.test_eq(seen, [(not removed, exp.kernels._KERNEL_SOURCE, str(folder))])


def test_state_dicts_move_both_ways():
    ours, ref = BatchNorm2d(4), nn.BatchNorm2d(4)
    check_like_torch(ours, ref, (8, 4, 3, 3), [True, True])
    theirs = nn.BatchNorm2d(4)
    theirs.load_state_dict(ours.state_dict())
    mine = BatchNorm2d(4)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(3, 4, 3, 3)
    torch.testing.assert_close(theirs.eval()(x), ours.eval()(x), **TOL)
    torch.testing.assert_close(mine.eval()(x), ref.eval()(x), **TOL)
    assert repr(ours) == repr(ref)


def test_a_network_trains_as_with_torchs_batchnorm():
    # seed 0, 20 SGD steps at lr 0.1 on random data: every weight within 1e-4 of the same net with
    # torch's batch norm
    def net(bn1, bn2):
        set_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3),
            bn2(8),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 36, 16),
            bn1(16),
            nn.ReLU(),
            nn.Linear(16, 3),
        )

    models = [net(BatchNorm1d, BatchNorm2d), net(nn.BatchNorm1d, nn.BatchNorm2d)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x, y = torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        for m, opt in zip(models, opts):
            F.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-4, atol=1e-4, msg=name)


def test_converts_to_sync_batchnorm():
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 36, 5),
        BatchNorm1d(5),
    )
    spread_affine(model[1], model[5])
    model(torch.randn(8, 1, 8, 8))  # moves the running statistics
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    ft.test_eq([type(m) for m in synced if 'Norm' in type(m).__name__], [nn.SyncBatchNorm] * 2)
    for (k, a), b in zip(model.state_dict().items(), synced.state_dict().values()):
        ft.test_eq(a, b)
    x = torch.randn(6, 1, 8, 8)
    torch.testing.assert_close(synced.eval()(x), model.eval()(x), **TOL)
    # without a process group, SyncBatchNorm trains like a batch norm: the converted model's
    # training step is ours
    torch.testing.assert_close(synced.train()(x), model.train()(x), **TOL)


@pytest.mark.parametrize(
    'make, message',
    [
        (lambda: BatchNorm2d(0), 'num_features must be a positive int, got 0'),
        (lambda: BatchNorm2d(True), 'num_features must be a positive int, got True'),
        (lambda: BatchNorm1d(4, eps=-1e-5), 'eps must be a number > 0, got -1e-05'),
        (lambda: BatchNorm1d(4, momentum=-0.1), r'momentum must be a number in \[0, 1\], or None'),
        (lambda: BatchNorm1d(4, momentum='0.1'), r'momentum must be a number in \[0, 1\]'),
        (
            lambda: BatchNorm2d(4)(torch.randn(2, 4, 3)),
            r'BatchNorm2d expects 4D input, got shape \(2, 4, 3\)',
        ),
        (
            lambda: BatchNorm1d(4)(torch.randn(4)),
            r'BatchNorm1d expects 2D or 3D input, got shape \(4,\)',
        ),
        (
            lambda: BatchNorm1d(4)(torch.randn(3, 5)),
            r'BatchNorm1d\(4\) got 5 channels \(dim 1 of input shape \(3, 5\)\)',
        ),
        (
            lambda: BatchNorm2d(4)(torch.randn(1, 4, 1, 1)),
            'needs more than 1 value per channel in training',
        ),
        (
            lambda: BatchNorm2d(4, track_running_stats=False).eval()(torch.randn(1, 4, 1, 1)),
            'more than 1 value per channel',
        ),
    ],
)
def test_batchnorm_bad_input(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    'make',
    [
        lambda: BatchNorm2d(4),
        lambda: BatchNorm1d(4),
        lambda: LayerNorm(4),
        lambda: GroupNorm(2, 4),
        lambda: RunningBatchNorm(4),
    ],
)
@pytest.mark.parametrize('dtype', [torch.int64, torch.uint8, torch.bool])
def test_integer_inputs_are_refused(make, dtype):
    """torch's norms refuse integers too; computed in the input's dtype, the output would be rounded
    (uint8: wrapped)."""
    norm = make()
    x = (
        torch.arange(32)
        .view(2, 4, 4, *((1,) if isinstance(norm, BatchNorm2d) else ()))
        .remainder(2)
        .to(dtype)
    )
    with pytest.raises(TypeError, match=f'needs a floating-point input, got dtype {dtype}'):
        norm(x)
    with pytest.raises(TypeError, match='floating-point'):
        norm.eval()(x)


def test_one_sample_is_fine_in_eval():
    bn = BatchNorm2d(4).eval()
    ft.test_eq(bn(torch.randn(1, 4, 1, 1)).shape, (1, 4, 1, 1))
    ft.test_eq(bn.num_batches_tracked, torch.tensor(0))


# ---------------- LayerNorm, GroupNorm


@settings(max_examples=40, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=2),
    norm=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    affine=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layernorm_equals_torch(lead, norm, affine, bias, seed):
    kw = dict(elementwise_affine=affine, bias=bias, **F64)
    check_like_torch(
        LayerNorm(norm, **kw),
        nn.LayerNorm(norm, **kw),
        (*lead, *norm),
        [True, False],
        seed,
        tol=dict(rtol=1e-9, atol=1e-9),
        dtype=torch.float64,
    )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4),
    groups=st.integers(1, 4),
    per_group=st.integers(1, 3),
    spatial=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_groupnorm_equals_torch(n, groups, per_group, spatial, affine, seed):
    c = groups * per_group
    # one value per group: torch's refuses, and so does ours
    if per_group * math.prod(spatial) == 1:
        with pytest.raises(ValueError, match='more than 1 value per group'):
            GroupNorm(groups, c)(torch.randn(n, c, *spatial))
        return
    check_like_torch(
        GroupNorm(groups, c, affine=affine, **F64),
        nn.GroupNorm(groups, c, affine=affine, **F64),
        (n, c, *spatial),
        [True, False],
        seed,
        tol=dict(rtol=1e-9, atol=1e-9),
        dtype=torch.float64,
    )


@pytest.mark.parametrize(
    'ours, ref, shape',
    [
        (lambda: LayerNorm(8), lambda: nn.LayerNorm(8), (4, 8)),
        (lambda: LayerNorm((8, 5, 5)), lambda: nn.LayerNorm((8, 5, 5)), (4, 8, 5, 5)),
        (
            lambda: LayerNorm(16, elementwise_affine=False),
            lambda: nn.LayerNorm(16, elementwise_affine=False),
            (3, 7, 16),
        ),
        (lambda: LayerNorm(16, bias=False), lambda: nn.LayerNorm(16, bias=False), (3, 7, 16)),
        (lambda: GroupNorm(4, 8), lambda: nn.GroupNorm(4, 8), (4, 8, 5, 5)),
        (lambda: GroupNorm(1, 8), lambda: nn.GroupNorm(1, 8), (4, 8, 3)),
        (lambda: GroupNorm(8, 8), lambda: nn.GroupNorm(8, 8), (4, 8, 5, 5)),
        (lambda: GroupNorm(2, 8), lambda: nn.GroupNorm(2, 8), (6, 8)),
        (
            lambda: GroupNorm(4, 8, affine=False),
            lambda: nn.GroupNorm(4, 8, affine=False),
            (4, 8, 5, 5),
        ),
    ],
)
def test_layer_and_group_norm_equal_torch_in_float32(ours, ref, shape):
    check_like_torch(ours(), ref(), shape, [True, False, True])


def test_groupnorm_special_cases_and_state_dicts():
    x = torch.randn(3, 6, 4, 4) * 2 + 1
    torch.testing.assert_close(GroupNorm(6, 6)(x), F.instance_norm(x), **TOL)
    torch.testing.assert_close(GroupNorm(1, 6)(x), LayerNorm((6, 4, 4))(x), **TOL)
    ft.test_eq(list(GroupNorm(2, 6).state_dict()), list(nn.GroupNorm(2, 6).state_dict()))
    ft.test_eq(list(LayerNorm(6).state_dict()), list(nn.LayerNorm(6).state_dict()))
    ln = LayerNorm(6)
    ln.load_state_dict(nn.LayerNorm(6).state_dict())
    out = GroupNorm(2, 6)(x.half())
    ft.test_eq(out.dtype, torch.float16)


@pytest.mark.parametrize(
    'make, message',
    [
        (lambda: GroupNorm(4, 6), r'num_channels \(6\) must be divisible by num_groups \(4\)'),
        (lambda: GroupNorm(0, 6), 'num_groups must be a positive int, got 0'),
        (lambda: GroupNorm(2, 6, eps=0), 'eps must be a number > 0, got 0'),
        (
            lambda: GroupNorm(2, 6)(torch.randn(3, 4, 2)),
            r'needs \(N, 6, \.\.\.\) inputs, got shape \(3, 4, 2\)',
        ),
        (lambda: GroupNorm(2, 6)(torch.randn(6)), 'needs'),
        (lambda: LayerNorm(0), 'normalized_shape must be a positive int'),
        (lambda: LayerNorm([4, -1]), 'normalized_shape must be a positive int'),
        (lambda: LayerNorm([]), 'normalized_shape must be a positive int'),
        (
            lambda: LayerNorm(4)(torch.randn(2, 5)),
            r'LayerNorm\(\[4\]\) needs inputs ending in \[4\], got shape \(2, 5\)',
        ),
        (lambda: LayerNorm((2, 4))(torch.randn(4)), r'needs inputs ending in \[2, 4\]'),
    ],
)
def test_layer_and_group_norm_bad_input(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ---------------- running batch norm


def batch_norm_of(layer, x):
    "Batch norm with `layer`'s weight and bias and `x`'s own statistics (biased variance)."
    return F.batch_norm(x, None, None, layer.weight, layer.bias, training=True, eps=layer.eps)


def grads(y, layer, x, grad):
    return torch.autograd.grad(y, (x, layer.weight, layer.bias), grad)


RBN_SHAPES = [(16, 6, 5, 5), (32, 6), (8, 6, 7)]


@pytest.mark.parametrize('shape', RBN_SHAPES, ids=['2d', '1d_2D_input', '1d_3D_input'])
@pytest.mark.parametrize('momentum', [0.1, 0.5, 1.0])
def test_running_batchnorm_at_its_first_batch_is_batch_norm(shape, momentum):
    """With no history the statistics are the batch's own, whatever the momentum: outputs and
    gradients are batch norm's."""
    set_seed(0)
    rbn = RunningBatchNorm(6, momentum=momentum)
    spread_affine(rbn)
    x, grad = (torch.randn(shape) * 3 + 1).requires_grad_(), torch.randn(shape)
    y, ref = rbn(x), batch_norm_of(rbn, x)
    torch.testing.assert_close(y, ref, **TOL)
    for mine, theirs in zip(grads(y, rbn, x, grad), grads(ref, rbn, x, grad)):
        torch.testing.assert_close(mine, theirs, **TOL)


def test_running_batchnorm_with_momentum_1_is_batch_norm_at_every_batch():
    set_seed(1)
    rbn = RunningBatchNorm(6, momentum=1.0)
    spread_affine(rbn)
    for bs in (16, 3, 40, 2):
        x, grad = (torch.randn(bs, 6, 4, 4) * 2 - 1).requires_grad_(), torch.randn(bs, 6, 4, 4)
        y, ref = rbn(x), batch_norm_of(rbn, x)
        torch.testing.assert_close(y, ref, **TOL)
        for mine, theirs in zip(grads(y, rbn, x, grad), grads(ref, rbn, x, grad)):
            torch.testing.assert_close(mine, theirs, **TOL)


def test_running_batchnorm_pools_the_batches_with_batch_size_weights():
    """After batches of 4, 9 and 2, mean and variance are those of every value seen, each batch
    weighted as written out here."""
    set_seed(2)
    momentum, sizes = 0.2, (4, 9, 2)
    rbn = RunningBatchNorm(3, momentum=momentum).double()
    spread_affine(rbn)
    xs = [torch.randn(bs, 3, 4, 4, dtype=torch.float64) * (1 + k) + k for k, bs in enumerate(sizes)]
    for x in xs:
        rbn(x)
    ws = [1 - (1 - momentum) / math.sqrt(bs - 1) for bs in sizes]
    weights = [w * math.prod(1 - v for v in ws[k + 1 :]) for k, w in enumerate(ws)]
    total = sum(wt * 16 * bs for wt, bs in zip(weights, sizes))
    mean = sum(wt * x.sum((0, 2, 3)) for wt, x in zip(weights, xs)) / total
    var = (
        sum(wt * ((x - mean.view(1, -1, 1, 1)) ** 2).sum((0, 2, 3)) for wt, x in zip(weights, xs))
        / total
    )
    ft.test_eq(int(rbn.seen), sum(sizes))
    # eval normalises with exactly those statistics, and leaves the buffers as they are
    before = copy.deepcopy(rbn.state_dict())
    x = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    want = F.batch_norm(x, mean, var, rbn.weight, rbn.bias, training=False, eps=rbn.eps)
    torch.testing.assert_close(rbn.eval()(x), want, rtol=1e-10, atol=1e-10)
    for k, v in rbn.state_dict().items():
        ft.test_eq(v, before[k])


def test_running_batchnorm_gradient_goes_through_the_current_batch_only():
    """gradcheck in float64 of a second training batch (each call on a fresh copy of the layer after
    its first batch)."""
    set_seed(3)
    rbn = RunningBatchNorm(3).double()
    spread_affine(rbn)
    rbn(torch.randn(6, 3, 4, 4, dtype=torch.float64))
    x = torch.randn(4, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: copy.deepcopy(rbn)(x), (x,))
    # and the gradient differs from batch norm's: the history moves the statistics, but takes no
    # gradient
    grad = torch.randn(4, 3, 4, 4, dtype=torch.float64)
    y = copy.deepcopy(rbn)(x)
    assert not torch.allclose(
        torch.autograd.grad(y, x, grad)[0],
        torch.autograd.grad(batch_norm_of(rbn, x), x, grad)[0],
        atol=1e-3,
    )


def test_running_batchnorm_variance_floor_during_warmup():
    "A channel of variance 0 is taken as 0.01 until 20 samples are seen, then as 0."
    rbn = RunningBatchNorm(2)
    x = torch.stack([torch.full((2, 3, 3), 5.0), torch.randn(2, 3, 3)], 1)  # channel 0 constant
    # x - mean is 0 in training
    torch.testing.assert_close(rbn(x)[:, 0], torch.zeros(2, 3, 3), **TOL)
    with torch.no_grad():  # mean 5.25 and variance exactly 0 for channel 0
        rbn.count.fill_(1.0)
        rbn.sums[0], rbn.sqrs[0] = 5.25, 5.25**2
    for seen, floor in [(2, 0.01), (19, 0.01), (20, 0.0)]:
        rbn.seen.fill_(seen)
        torch.testing.assert_close(
            rbn.eval()(x)[:, 0],
            torch.full((2, 3, 3), -0.25 / math.sqrt(floor + 1e-5)),
            rtol=1e-4,
            atol=0,
        )


def test_running_batchnorm_state_half_inputs_and_untrained_eval():
    set_seed(4)
    rbn = RunningBatchNorm(4)
    x = torch.randn(8, 4, 3, 3)
    # no statistics yet: mean 0, variance 1
    torch.testing.assert_close(rbn.eval()(x), x, rtol=1e-4, atol=1e-4)
    rbn.train()
    for _ in range(3):
        rbn(torch.randn(8, 4, 3, 3) * 2 + 1)
    again = RunningBatchNorm(4)
    again.load_state_dict(rbn.state_dict())
    ft.test_eq(list(again.state_dict()), ['weight', 'bias', 'sums', 'sqrs', 'count', 'seen'])
    torch.testing.assert_close(again.eval()(x), rbn.eval()(x), rtol=0, atol=0)
    out = rbn(x.half())
    ft.test_eq((out.dtype, rbn.sums.dtype), (torch.float16, torch.float32))
    torch.testing.assert_close(out.float(), rbn(x), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    'make, message',
    [
        (lambda: RunningBatchNorm(0), 'num_features must be a positive int, got 0'),
        (lambda: RunningBatchNorm(4, momentum=0), r'momentum must be a number in \(0, 1\], got 0'),
        (lambda: RunningBatchNorm(4, momentum=1.5), r'momentum must be a number in \(0, 1\]'),
        (lambda: RunningBatchNorm(4, momentum=True), r'momentum must be a number in \(0, 1\]'),
        (lambda: RunningBatchNorm(4, eps=-1), 'eps must be a number > 0'),
        (
            lambda: RunningBatchNorm(4)(torch.randn(1, 4, 3, 3)),
            r'needs batches of 2 or more in training, got shape \(1, 4, 3, 3\)',
        ),
        (
            lambda: RunningBatchNorm(4)(torch.randn(2, 3, 3, 3)),
            r'RunningBatchNorm\(4\) needs \(N, 4, \.\.\.\) inputs, got shape \(2, 3, 3, 3\)',
        ),
        (lambda: RunningBatchNorm(4)(torch.randn(4)), 'needs'),
    ],
)
def test_running_batchnorm_bad_input(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@cuda
@pytest.mark.parametrize(
    'make',
    [lambda: BatchNorm2d(6), lambda: RunningBatchNorm(6)],
    ids=['batchnorm', 'running_batchnorm'],
)
def test_on_cuda_equal_to_the_cpu_without_waiting_for_the_gpu(make):
    """On a GPU: the CPU's outputs, gradients and buffers within 1e-4 over a few batches, and no
    step makes the host wait."""
    set_seed(5)
    cpu = make()
    spread_affine(cpu)
    gpu = copy.deepcopy(cpu).cuda()
    for bs in (8, 2, 16):
        x, grad = torch.randn(bs, 6, 5, 5) * 2 + 1, torch.randn(bs, 6, 5, 5)
        xc, xg, gg = x.clone().requires_grad_(), x.cuda().requires_grad_(), grad.cuda()
        torch.cuda.synchronize()
        # an operation that synchronises with the GPU raises
        torch.cuda.set_sync_debug_mode('error')
        try:
            yg = gpu(xg)
            yg.backward(gg)
        finally:
            torch.cuda.set_sync_debug_mode('default')
        yc = cpu(xc)
        yc.backward(grad)
        torch.testing.assert_close(yg.cpu(), yc, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
        for (name, b), bc in zip(gpu.named_buffers(), cpu.buffers()):
            torch.testing.assert_close(b.cpu(), bc, rtol=1e-4, atol=1e-4, msg=name)
    gpu.eval()
    cpu.eval()
    x = torch.randn(4, 6, 5, 5)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), rtol=1e-4, atol=1e-4)

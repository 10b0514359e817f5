"""Unit tests for exp.loss: logsumexp, log_softmax, nll, cross_entropy and accuracy against
PyTorch."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st

from exp.loss import (
    _FEW_ELEMENTS,
    accuracy,
    cross_entropy,
    log_softmax,
    logsumexp,
    nll,
    try_compile,
)

inf, nan = math.inf, math.nan
# log_softmax takes one path up to _FEW_ELEMENTS elements and another above: test both
SHAPES = [(32, 10), (_FEW_ELEMENTS // 8, 10)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
HALF = (torch.float16, torch.bfloat16)

# Allowed error, elementwise: |ours - reference| <= ATOL + RTOL * |reference|, the reference being
# PyTorch in float64 on the same (already rounded) input. float32/float64: a few units in the last
# place of the computation. float16/bfloat16 are computed in float32 and rounded once at the end:
# half a unit of the output dtype, plus the float32 error.
RTOL = {torch.float64: 1e-14, torch.float32: 1e-6, torch.float16: 2**-10, torch.bfloat16: 2**-7}
ATOL = {torch.float64: 1e-13, torch.float32: 1e-6, torch.float16: 2e-6, torch.bfloat16: 2e-6}


def ref_logsumexp(x):
    return torch.logsumexp(x, -1)


def ref_log_softmax(x):
    return F.log_softmax(x, -1)


def assert_close_to(ours, ref, dtype, scale=1.0, ref_rtol=0.0):
    """Elementwise check of `ours` against the float64 `ref`; `scale` widens ATOL for sums of many
    terms."""
    assert ours.dtype == dtype, (ours.dtype, dtype)
    torch.testing.assert_close(
        ours.double(), ref, rtol=RTOL[dtype] + ref_rtol, atol=ATOL[dtype] * scale, equal_nan=True
    )


def check(ours, theirs, x, *args, up_seed=0):
    """Values and input gradients of `ours(x, *args)` against `theirs` run in float64 on the same
    input."""
    dtype = x.dtype
    xo, xr = x.detach().clone().requires_grad_(), x.detach().double().requires_grad_()
    yo, yr = ours(xo, *args), theirs(xr, *args)
    assert yo.isfinite().all()
    assert_close_to(yo.detach(), yr.detach(), dtype)
    up = torch.randn(
        yr.shape, generator=torch.Generator().manual_seed(up_seed), dtype=torch.float64
    ).to(dtype)
    yo.backward(up)
    yr.backward(up.double())  # the same (rounded) upstream gradient for both
    assert xo.grad.dtype == dtype and xo.grad.isfinite().all()
    # The error of an input gradient grows with the upstream gradient it is made of: for log_softmax
    # each one sums its row of `up`, for the others it is one entry of `up` times a probability.
    # PyTorch's own float64 backward computes exp(x - logsumexp(x)), whose rounding near |x| = 1e4
    # costs about 1e-12 relative: the float64 reference is only that good.
    up_size = (up.double().abs().sum(-1) if up.shape == x.shape else up.double().abs()).max().item()
    ref_rtol = 4 * torch.finfo(torch.float64).eps * (1 + x.double().abs().max().item())
    assert_close_to(xo.grad, xr.grad, dtype, scale=1 + up_size, ref_rtol=ref_rtol)


def logits(shape, scale, seed=0):
    return (
        torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        * scale
    )


# ---------------- against PyTorch, fixed inputs


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('scale', [1.0, 10.0, 1e4])
@pytest.mark.parametrize('shape', SHAPES, ids=str)
def test_logsumexp_and_log_softmax_match_torch(shape, dtype, scale):
    x = logits(shape, scale).to(dtype)
    check(logsumexp, ref_logsumexp, x)
    check(log_softmax, ref_log_softmax, x)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('scale', [1.0, 1e4])
@pytest.mark.parametrize('shape', SHAPES, ids=str)
def test_nll_and_cross_entropy_match_torch(shape, dtype, scale):
    x = logits(shape, scale, seed=1).to(dtype)
    target = torch.randint(0, 10, shape[:1], generator=torch.Generator().manual_seed(2))
    check(cross_entropy, F.cross_entropy, x, target)
    check(nll, F.nll_loss, F.log_softmax(x.double(), -1).to(dtype), target)


@pytest.mark.parametrize('shape', [(2, 3, 7), (3, 50, 40)], ids=str)
def test_more_dimensions(shape):
    x = logits(shape, 5.0).float()
    check(logsumexp, ref_logsumexp, x)
    check(log_softmax, ref_log_softmax, x)
    ft.test_eq(logsumexp(x).shape, shape[:-1])


def test_both_paths_agree():
    x = logits((_FEW_ELEMENTS // 16 + 1, 16), 20.0, seed=4).float()  # one row over the threshold
    ft.test_close(log_softmax(x)[:-1], log_softmax(x[:-1]), eps=1e-5)


def test_one_class_and_equal_logits():
    x = torch.tensor([[3.0], [-2e4]])
    ft.test_eq(log_softmax(x), torch.zeros(2, 1))
    ft.test_eq(logsumexp(x), x[:, 0])
    ft.test_close(log_softmax(torch.full((3, 5), 7e3)), torch.full((3, 5), -math.log(5)), eps=1e-6)


@pytest.mark.parametrize('shape', SHAPES, ids=str)
def test_probabilities_sum_to_one(shape):
    x = logits(shape, 100.0, seed=3).float()
    ft.test_close(log_softmax(x).exp().sum(-1), torch.ones(len(x)), eps=1e-5)


@pytest.mark.parametrize('shape', SHAPES, ids=str)
def test_inputs_are_not_modified(shape):
    for dtype in DTYPES:
        x = logits(shape, 3.0).to(dtype)
        keep = x.clone()
        for f in (logsumexp, log_softmax):
            f(x)
        cross_entropy(x, torch.zeros(len(x), dtype=torch.long))
        assert torch.equal(x, keep), dtype


def test_half_precision_is_finite_where_exp_overflows():
    x = torch.tensor([[1e4, 9.99e3, -1e4]])
    for dtype in HALF:
        for f in (logsumexp, log_softmax):
            out = f(x.to(dtype))
            assert out.dtype == dtype and out.isfinite().all(), (f.__name__, dtype, out)
        assert cross_entropy(x.to(dtype), torch.tensor([2])).isfinite()


def test_stable_where_the_textbook_formula_fails():
    x = torch.tensor([[1000.0, 999.0, 0.0], [-1000.0, -1001.0, -1002.0]])
    assert not (x.exp() / x.exp().sum(-1, keepdim=True)).log().isfinite().all()
    assert_close_to(log_softmax(x), ref_log_softmax(x.double()), torch.float32)
    assert_close_to(logsumexp(x), ref_logsumexp(x.double()), torch.float32)


def test_the_tolerance_catches_the_round_trip_through_m():
    # `x - logsumexp(x)` is stable but adds the shift back then subtracts it, losing the low bits
    # near 1e4; ours subtracts it once. The elementwise tolerance must tell the two apart.
    x = torch.tensor([[1e4, 1e4 - 1.5, 1e4 - 3.0]])
    ref = ref_log_softmax(x.double())
    assert_close_to(log_softmax(x), ref, torch.float32)
    with pytest.raises(AssertionError):
        assert_close_to(x - logsumexp(x).unsqueeze(-1), ref, torch.float32)


# ---------------- infinities and nan

EDGE = torch.tensor(
    [
        [0.0, -inf, 1.0],
        [-inf, -inf, -inf],
        [inf, 1.0, 2.0],
        [inf, -inf, 0.0],
        [inf, inf, 0.0],
        [nan, 1.0, 2.0],
        [-inf, 5.0, -inf],
    ]
)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_logsumexp_infinities_like_torch(dtype):
    x = EDGE.to(dtype)
    ours = logsumexp(x)
    torch.testing.assert_close(ours, torch.logsumexp(x, -1), equal_nan=True)
    ft.test_eq(ours[1].item(), -inf)  # all masked: -inf, not nan
    ft.test_eq(ours[2].item(), inf)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('repeat', [1, _FEW_ELEMENTS // EDGE.numel() + 1])
def test_log_softmax_infinities_like_torch(dtype, repeat):
    x = EDGE.repeat(repeat, 1).to(dtype)
    torch.testing.assert_close(log_softmax(x), F.log_softmax(x, -1), equal_nan=True)


@pytest.mark.parametrize('shape', [(16, 8), (_FEW_ELEMENTS // 8, 16)], ids=str)
def test_masked_logits_values_and_gradients(shape):
    x = logits(shape, 4.0, seed=5).float()
    x[torch.rand(shape, generator=torch.Generator().manual_seed(6)) < 0.3] = -inf
    x[:, 0] = 1.0  # at least one class left in every row
    for ours, theirs in ((logsumexp, ref_logsumexp), (log_softmax, ref_log_softmax)):
        xo, xr = x.clone().requires_grad_(), x.double().requires_grad_()
        yo, yr = ours(xo), theirs(xr)
        torch.testing.assert_close(yo.double(), yr, rtol=1e-6, atol=1e-6)
        up = torch.randn(yr.shape, dtype=torch.float64)
        yo.backward(up.float())
        yr.backward(up)
        assert xo.grad.isfinite().all()
        torch.testing.assert_close(xo.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)


# ---------------- property tests


def tensors(draw, shape, dtype, magnitude):
    "A tensor of `shape` in `dtype`, entries drawn by hypothesis in [-magnitude, magnitude]."
    n = math.prod(shape)
    values = draw(
        st.lists(
            st.floats(-magnitude, magnitude, allow_nan=False, width=32), min_size=n, max_size=n
        )
    )
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


@st.composite
def logit_cases(draw, ndim=None):
    dims = [draw(st.integers(1, 6)) for _ in range(ndim or draw(st.integers(1, 3)))]
    dims[-1] = draw(st.integers(1, 12))
    dtype = draw(st.sampled_from(DTYPES))
    magnitude = draw(st.sampled_from([1.0, 30.0, 1e4]))
    return tensors(draw, dims, dtype, magnitude), draw(st.integers(0, 2**16))


@settings(max_examples=80, deadline=None)
@given(logit_cases())
def test_property_logsumexp_and_log_softmax(case):
    x, seed = case
    check(logsumexp, ref_logsumexp, x, up_seed=seed)
    check(log_softmax, ref_log_softmax, x, up_seed=seed)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(400, 600),
    st.integers(_FEW_ELEMENTS // 400 + 1, 60),
    st.sampled_from(DTYPES),
    st.sampled_from([1.0, 30.0, 1e4]),
    st.integers(0, 2**16),
)
def test_property_large_path(rows, cols, dtype, magnitude, seed):
    # too many values to draw one by one: hypothesis picks the shape, dtype, scale and seed
    assert rows * cols > _FEW_ELEMENTS
    x = logits((rows, cols), magnitude, seed=seed).clamp(-1e4, 1e4)
    x[:, seed % cols] = x.amax(-1)  # ties at the maximum
    x = x.to(dtype)
    check(logsumexp, ref_logsumexp, x, up_seed=seed)
    check(log_softmax, ref_log_softmax, x, up_seed=seed)
    with torch.no_grad():  # without autograd the large path writes its output over its first buffer
        assert_close_to(log_softmax(x), ref_log_softmax(x.double()), dtype)
    target = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(seed))
    check(cross_entropy, F.cross_entropy, x, target, up_seed=seed)


@settings(max_examples=60, deadline=None)
@given(logit_cases(ndim=2), st.data())
def test_property_nll_and_cross_entropy(case, data):
    x, seed = case
    n, c = x.shape
    target = torch.tensor(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
    check(cross_entropy, F.cross_entropy, x, target, up_seed=seed)
    check(nll, F.nll_loss, F.log_softmax(x.double(), -1).to(x.dtype), target, up_seed=seed)
    ft.test_eq(accuracy(x, target), (x.double().argmax(1) == target).float().mean())


# ---------------- nll targets


@pytest.mark.parametrize('dtype', [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_nll_accepts_any_integer_target(dtype):
    lp = F.log_softmax(logits((6, 4), 2.0), -1)
    target = torch.tensor([0, 3, 1, 1, 2, 3])
    ft.test_close(nll(lp, target.to(dtype)), F.nll_loss(lp, target), eps=1e-12)


def test_nll_empty_batch_is_nan_like_torch():
    assert nll(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)).isnan()
    assert F.nll_loss(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)).isnan()


@pytest.mark.parametrize(
    'target,error,message',
    [
        (
            torch.tensor([0.0, 1.0, 2.0]),
            TypeError,
            r'target must hold integer class indices, got target.dtype=torch.float32',
        ),
        (torch.tensor([True, False, True]), TypeError, r'target.dtype=torch.bool'),
        ([0, 1, 2], TypeError, r'target must be a torch.Tensor, got list'),
        (
            torch.tensor([[0], [1], [2]]),
            ValueError,
            r'target must be 1-d \(N,\), got shape \(3, 1\)',
        ),
        (torch.tensor([0, 1]), ValueError, r'target has 2 labels but input has 3 rows'),
        (
            torch.tensor([0, 1, 4]),
            ValueError,
            r'target must hold class indices in \[0, 4\), got values from 0 to 4',
        ),
        (
            torch.tensor([0, -1, 2]),
            ValueError,
            r'target must hold class indices in \[0, 4\), got values from -1 to 2',
        ),
    ],
)
def test_bad_targets(target, error, message):
    lp = F.log_softmax(logits((3, 4), 1.0), -1)
    with pytest.raises(error, match=message):
        nll(lp, target)
    with pytest.raises(error, match=message):
        cross_entropy(lp, target)


def test_bad_scores():
    y = torch.tensor([0, 1])
    with pytest.raises(TypeError, match=r'x must be a torch.Tensor, got list'):
        logsumexp([[1.0, 2.0]])
    with pytest.raises(
        TypeError, match=r'x must be a floating point tensor, got x.dtype=torch.int64'
    ):
        log_softmax(y)
    with pytest.raises(ValueError, match=r'x must have at least 1 dimension'):
        logsumexp(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r'x must have at least one class.*\(2, 0\)'):
        log_softmax(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r'input must be 2-d \(N, C\), got shape \(2,\)'):
        nll(torch.zeros(2), y)
    with pytest.raises(ValueError, match=r'pred must be 2-d \(N, C\), got shape \(2, 3, 4\)'):
        cross_entropy(torch.zeros(2, 3, 4), y)
    with pytest.raises(TypeError, match=r'pred must be a floating point tensor'):
        cross_entropy(torch.zeros(2, 3, dtype=torch.long), y)


# ---------------- accuracy


def test_accuracy_by_hand():
    out = torch.tensor(
        [
            [0.1, 0.8, 0.1],  # predicts 1
            [3.0, -1.0, 0.0],  # predicts 0
            [0.0, 0.0, 5.0],  # predicts 2
            [1.0, 2.0, 3.0],  # predicts 2
            [4.0, 4.0, 0.0],
        ]
    )  # a tie: the first maximum, 0
    acc = accuracy(out, torch.tensor([1, 0, 2, 0, 0]))
    ft.test_eq(acc, torch.tensor(0.8))
    ft.test_eq(acc.dtype, torch.float32)
    ft.test_eq(accuracy(out.half(), torch.tensor([0, 1, 0, 1, 1])), torch.tensor(0.0))


@given(st.integers(1, 300), st.integers(1, 12), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_accuracy_batch_sum_counts(n, c, seed):
    """accuracy.batch_sum is the number of right answers: accuracy times the batch size, as an exact
    integer."""
    g = torch.Generator().manual_seed(seed)
    out, targ = torch.randn(n, c, generator=g), torch.randint(0, c, (n,), generator=g)
    count = accuracy.batch_sum(out, targ)
    ft.test_eq(count.dtype, torch.int64)
    ft.test_eq(int(count), sum(int(row.argmax()) == int(t) for row, t in zip(out, targ)))
    ft.test_close(float(count) / n, float(accuracy(out, targ)), eps=1e-6)


def test_accuracy_bad_input():
    out = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r'targ has 3 labels but out has 4 rows'):
        accuracy(out, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r'targ must hold integer class indices'):
        accuracy(out, torch.zeros(4))
    with pytest.raises(ValueError, match=r'out must be 2-d'):
        accuracy(torch.zeros(4), torch.zeros(4, dtype=torch.long))
    # a label past the last class, or negative, is refused as nll refuses it: it would only count as
    # a wrong answer
    for bad in ([0, 1, 2, 3], [-1, 0, 0, 0]):
        with pytest.raises(ValueError, match=r'targ must hold class indices in \[0, 3\)'):
            accuracy(out, torch.tensor(bad))


# ---------------- torch.compile


def test_try_compile_falls_back_when_compiling_fails(monkeypatch):
    """Where the first call of the compiled function fails (no C compiler), try_compile returns the
    function and why."""
    calls = []

    def compile_without_compiler(fn, **kwargs):
        calls.append(kwargs)

        def compiled(*args):
            raise RuntimeError(
                'InductorError: CppCompileError: C++ compile error\n(the command line)'
            )

        return compiled

    monkeypatch.setattr(torch, 'compile', compile_without_compiler)
    x = torch.randn(4, 3)
    fn, why_not = try_compile(log_softmax, x, dynamic=False)
    assert (
        fn is log_softmax
        and why_not == 'RuntimeError: InductorError: CppCompileError: C++ compile error'
    )
    ft.test_eq(calls, [{'dynamic': False}])


@pytest.mark.parametrize(
    'error, why_not',
    [
        (
            RuntimeError('torch.compile is not supported on this Python'),
            'RuntimeError: torch.compile is not supported on this Python',
        ),
        (NotImplementedError(), 'NotImplementedError: '),
    ],
)
def test_try_compile_falls_back_when_torch_compile_refuses(monkeypatch, error, why_not):
    """Where torch.compile itself raises (before any call), the function comes back as it is, with
    the reason."""

    def refuse(fn, **kwargs):
        raise error

    monkeypatch.setattr(torch, 'compile', refuse)
    fn, reason = try_compile(log_softmax, torch.randn(4, 3))
    assert fn is log_softmax
    ft.test_eq(reason, why_not)


def test_try_compile_returns_the_compiled_function(monkeypatch):
    """Where compiling works, the compiled function comes back, already called once on the example,
    and no reason."""
    seen = []

    def compile_ok(fn, **kwargs):
        def compiled(*args):
            seen.append(args)
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, 'compile', compile_ok)
    x = torch.randn(4, 3)
    fn, why_not = try_compile(log_softmax, x)
    assert why_not is None and fn is not log_softmax and len(seen) == 1 and seen[0][0] is x
    torch.testing.assert_close(fn(x), F.log_softmax(x, -1))


@pytest.mark.slow
def test_try_compile_log_softmax():
    """Compiled (where this machine can), our log_softmax still equals F.log_softmax; else the
    reason is given."""
    x = torch.randn(64, 10) * 3
    fn, why_not = try_compile(log_softmax, x, dynamic=False)
    assert (fn is log_softmax) == (why_not is not None)
    torch.testing.assert_close(fn(x), F.log_softmax(x, -1))
    torch.compiler.reset()


@pytest.mark.slow
def test_try_compile_without_a_cxx_compiler(tmp_path):
    """On a machine whose C++ compiler is missing (CXX names none; a fresh Inductor cache), the
    function runs eager."""
    code = (
        'import torch, torch.nn.functional as F\n'
        'from exp.loss import log_softmax, try_compile\n'
        'x = torch.randn(64, 10)\n'
        'fn, why_not = try_compile(log_softmax, x, dynamic=False)\n'
        'assert fn is log_softmax and "compiler" in why_not.lower(), why_not\n'
        'torch.testing.assert_close(fn(x), F.log_softmax(x, -1))\n'
    )
    env = {
        **os.environ,
        'CXX': str(tmp_path / 'no-such-c++'),
        'TORCHINDUCTOR_CACHE_DIR': str(tmp_path / 'cache'),
    }
    proc = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

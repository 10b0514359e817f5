"""Unit tests for exp.backprop: the hand-written backward passes against autograd (gradcheck) and
nn.Linear / nn.ReLU."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st
from torch import nn

from exp.backprop import Linear, LinearFunction, Relu, ReluFunction
from exp.data import set_seed


def rand64(*shape, seed=0, grad=True):
    return torch.randn(
        *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    ).requires_grad_(grad)


@pytest.mark.parametrize('x_shape', [(6, 4), (3, 2, 4), (2, 1, 3, 4)], ids=['2d', '3d', '4d'])
@pytest.mark.parametrize('bias', [True, False])
def test_linear_function_gradcheck(x_shape, bias):
    x, w = rand64(*x_shape, seed=1), rand64(5, 4, seed=2)
    b = rand64(5, seed=3) if bias else None
    assert torch.autograd.gradcheck(LinearFunction.apply, (x, w, b))
    # the input needs no gradient
    assert torch.autograd.gradcheck(LinearFunction.apply, (x.detach(), w, b))


def test_linear_function_returns_only_the_gradients_asked_for():
    x, w, b = rand64(6, 4, grad=False), rand64(5, 4, seed=1), rand64(5, seed=2, grad=False)
    LinearFunction.apply(x, w, b).sum().backward()
    assert x.grad is None and b.grad is None and w.grad is not None
    ft.test_close(w.grad, torch.ones(6, 5, dtype=torch.float64).t() @ x, eps=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_linear_function_equals_f_linear(n, n_in, n_out, seed):
    x, w, b = (
        rand64(n, n_in, seed=seed),
        rand64(n_out, n_in, seed=seed + 1),
        rand64(n_out, seed=seed + 2),
    )
    up = rand64(n, n_out, seed=seed + 3, grad=False)
    ours = torch.autograd.grad(LinearFunction.apply(x, w, b), (x, w, b), up)
    theirs = torch.autograd.grad(F.linear(x, w, b), (x, w, b), up)
    for a, t in zip(ours, theirs):
        ft.test_close(a, t, eps=1e-12)


def test_relu_function_gradcheck_and_values():
    x = rand64(4, 7)
    assert torch.autograd.gradcheck(ReluFunction.apply, (x,))
    assert torch.equal(ReluFunction.apply(x), F.relu(x))
    up = rand64(4, 7, seed=5, grad=False)
    (g,) = torch.autograd.grad(ReluFunction.apply(x), x, up)
    assert torch.equal(g, torch.where(x > 0, up, torch.zeros_like(up)))


def test_modules_are_drop_ins_for_nn_linear_and_relu():
    set_seed(0)
    ours = nn.Sequential(Linear(20, 8), Relu(), Linear(8, 3))
    set_seed(0)
    theirs = nn.Sequential(nn.Linear(20, 8), nn.ReLU(), nn.Linear(8, 3))
    for (k, p), (k2, q) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        ft.test_eq(k, k2)
        assert torch.equal(p, q)  # PyTorch's default init, the same random numbers
    x, y = torch.randn(16, 20), torch.randint(0, 3, (16,))
    ft.test_close(ours(x), theirs(x), eps=1e-6)
    F.cross_entropy(ours(x), y).backward()
    F.cross_entropy(theirs(x), y).backward()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        ft.test_close(p.grad, q.grad, eps=1e-6)
    theirs.load_state_dict(ours.state_dict())  # and state dicts load either way
    assert 'in_features=20, out_features=8, bias=True' in repr(ours)


def test_linear_without_bias_and_with_leading_dimensions():
    layer = Linear(4, 2, bias=False)
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ['weight']
    x = torch.randn(3, 5, 4)
    ft.test_eq(layer(x).shape, (3, 5, 2))
    ft.test_close(layer(x), F.linear(x, layer.weight), eps=1e-6)


@pytest.mark.parametrize(
    'make, error, message',
    [
        (lambda: Linear(0, 3), ValueError, 'in_features must be >= 1, got 0'),
        (lambda: Linear(4, -1), ValueError, 'out_features must be >= 1, got -1'),
        (lambda: Linear(4.0, 3), TypeError, 'in_features must be an int, got 4.0'),
        (lambda: Linear(True, 3), TypeError, 'in_features must be an int, got True'),
        (lambda: Linear(4, 3, bias=None), TypeError, 'bias must be True or False, got None'),
        (
            lambda: Linear(4, 3)(torch.randn(2, 5)),
            ValueError,
            r'x must have 4 features in its last dimension, got shape \(2, 5\)',
        ),
        (
            lambda: Linear(4, 3)(torch.tensor(1.0)),
            ValueError,
            r'x must have 4 features in its last dimension, got shape \(\)',
        ),
        (
            lambda: Linear(4, 3)(torch.ones(2, 4, dtype=torch.long)),
            TypeError,
            'x must be a floating point tensor, got torch.int64',
        ),
        (
            lambda: Linear(4, 3)([1.0, 2.0, 3.0, 4.0]),
            TypeError,
            'x must be a floating point tensor, got list',
        ),
    ],
)
def test_bad_input(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_the_default_init_is_uniform_in_one_over_sqrt_fan_in():
    "kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(fan_in), std 1/sqrt(3 fan_in), 0.41 of Kaiming's."
    import math

    set_seed(0)
    fan_in = 400
    weight = Linear(fan_in, 300).weight.detach()
    bound = 1 / math.sqrt(fan_in)
    assert weight.abs().max() <= bound and weight.abs().max() > 0.99 * bound
    assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.01)
    assert weight.std().item() / math.sqrt(2 / fan_in) == pytest.approx(math.sqrt(1 / 6), rel=0.01)


def test_linear_takes_a_numpy_int_as_a_size():
    # a size from a shape or an array is an int to numbers.Integral: a layer, not a TypeError
    lin = Linear(np.int64(4), np.int64(3))
    assert (lin.in_features, lin.out_features) == (4, 3) and type(lin.in_features) is int
    assert lin(torch.ones(2, 4)).shape == (2, 3)

"""The scalar autograd engine of 02c (exp.autograd.Value) against torch.autograd, and the checks of
the exercises where the learner derives gradients (02b: the linear layer's and cross entropy's; 02c:
a value used twice, tanh): each accepts the right answer and names each usual mistake."""

import math
import sys

import pytest
import torch
import torch.nn.functional as F

from exp.autograd import Value
from exp.exercises import (
    ExerciseError,
    check_ce_grad,
    check_lin_grads,
    check_reused_grad,
    check_value_tanh,
)


def expression(a, b, c):
    "An expression in +, * and relu that uses `a` three times: runs on Values and on tensors."
    d = a * b + c
    return (d * a).relu() + a * a + 2 * b + 1.5


def grads_both(f, point):
    "f's output and its gradients at `point`, by Value and by torch.autograd (float64)."
    ours = [Value(v) for v in point]
    out = f(*ours)
    out.backward()
    theirs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in point]
    ref = f(*theirs)
    ref.backward()
    return [out.data] + [v.grad for v in ours], [ref.item()] + [t.grad.item() for t in theirs]


@pytest.mark.parametrize(
    'point', [(2.0, -3.0, 10.0), (2.0, -3.0, 1.0), (-0.5, 0.25, 3.0), (0.0, 1.0, 1.0)]
)
def test_an_expression_gives_torchs_value_and_gradients(point):
    ours, theirs = grads_both(expression, point)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def test_random_expressions_give_torchs_gradients():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        point = tuple(torch.randn(3, generator=gen, dtype=torch.float64).tolist())
        ours, theirs = grads_both(expression, point)
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def test_one_neuron_of_the_mlp_gives_torchs_gradients():
    "relu(x . w + b) over 784 inputs: every input's and weight's gradient, allclose to torch's."
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(784, generator=gen, dtype=torch.float64), torch.randn(784, generator=gen)
    w = w.double() / 28
    b = torch.tensor(0.1, dtype=torch.float64)
    if x @ w + b <= 0:  # a neuron that fires, so that the gradients are not all zero
        w = -w
    xs, ws, bv = [Value(v) for v in x.tolist()], [Value(v) for v in w.tolist()], Value(b.item())
    out = sum((xi * wi for xi, wi in zip(xs, ws)), bv).relu()
    out.backward()
    tx, tw, tb = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = (tx @ tw + tb).relu()
    ref.backward()
    assert out.data == pytest.approx(ref.item(), rel=1e-12)
    for ours, theirs in ((xs, tx), (ws, tw), ([bv], tb)):
        got = torch.tensor([v.grad for v in ours], dtype=torch.float64)
        assert torch.allclose(got, theirs.grad.reshape(-1), rtol=1e-12, atol=1e-12)
    assert len(out.topo_order()) == 4 * 784 + 2


def test_a_value_used_twice_gets_both_shares():
    a = Value(3.0)
    (a * a + a * 2).backward()
    assert a.grad == 8.0
    b = Value(-1.0)
    (b + b + b).backward()
    assert b.grad == 3.0


def test_relu_stops_the_gradient_where_the_input_was_not_positive():
    for x, want in ((-2.0, 0.0), (0.0, 0.0), (0.5, 1.0)):
        v = Value(x)
        v.relu().backward()
        assert v.grad == want, x


def test_the_topological_order_puts_each_node_after_its_children():
    a, b = Value(1.0), Value(2.0)
    out = (a * b + a).relu() * b
    order = out.topo_order()
    assert order[-1] is out and len(order) == len({id(v) for v in order}) == 6
    position = {id(v): i for i, v in enumerate(order)}
    for v in order:
        assert all(position[id(child)] < position[id(v)] for child in v.children)


def test_a_long_chain_does_not_reach_the_recursion_limit():
    n = sys.getrecursionlimit() * 3
    xs = [Value(1.0) for _ in range(n)]
    total = sum(xs)
    total.backward()
    assert total.data == n and all(x.grad == 1.0 for x in xs)


def test_backward_twice_gives_the_same_gradients():
    a, b = Value(2.0), Value(-1.0)
    out = a * b + a
    out.backward()
    first = (a.grad, b.grad)
    out.backward()
    assert (a.grad, b.grad) == first == (0.0, 2.0)


def test_numbers_mix_with_values_on_either_side():
    a = Value(2.0)
    out = 3 * a + 1 + a * 0.5
    out.backward()
    assert (out.data, a.grad) == (8.0, 3.5)
    assert repr(out) == 'Value(8, grad=1)'


@pytest.mark.parametrize('bad', ['2', None, True, torch.tensor(1.0), [1.0]])
def test_value_refuses_what_is_not_a_real_number(bad):
    with pytest.raises(TypeError, match='data must be a real number, got'):
        Value(bad)
    with pytest.raises(TypeError, match='data must be a real number'):
        Value(1.0) + bad


# the exercises' checks


def correct(check, answer, capsys):
    check(answer)
    name = check.__name__.removeprefix('check_')
    assert capsys.readouterr().out == f'{name}: correct\n'


def lin_grads(inp, w, out_g):
    return out_g @ w.t(), inp.t() @ out_g, out_g.sum(0)


def test_lin_grads_accepts_the_right_answer(capsys):
    correct(check_lin_grads, lin_grads, capsys)


@pytest.mark.parametrize(
    'wrong, message',
    [
        (lambda i, w, g: (g @ w, i.t() @ g, g.sum(0)), r'inp_g .* a missing transpose: inp_g ='),
        (lambda i, w, g: (g @ w.t(), g.t() @ i, g.sum(0)), r'w_g .* a missing transpose'),
        (
            lambda i, w, g: (g @ w.t(), i.t() @ g / len(i), g.sum(0)),
            r'w_g .* a mean over the batch where a sum belongs',
        ),
        (
            lambda i, w, g: (g @ w.t(), i.t() @ g, g.mean(0)),
            r'b_g is wrong: a mean over the batch where a sum belongs',
        ),
        (lambda i, w, g: (g @ w.t(), i.t() @ g, g), r'b_g has one row per example'),
        (lambda i, w, g: (g @ w.t(), i.t() @ g), r'should return a tuple \(inp_g, w_g, b_g\)'),
        # right on a square weight, wrong on a rectangular one: the shapes give it away
        (
            lambda i, w, g: (g @ (w if w.shape[0] != w.shape[1] else w.t()), i.t() @ g, g.sum(0)),
            r'raised: .*a missing transpose',
        ),
        (
            lambda i, w, g: (
                g @ w.t(),
                (i.t() @ g).t() if w.shape[0] != w.shape[1] else i.t() @ g,
                g.sum(0),
            ),
            r"w_g has shape \(3, 5\), w's transposed \(a missing transpose\)",
        ),
    ],
)
def test_lin_grads_names_each_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_lin_grads(wrong)


def test_lin_grads_lets_other_errors_through():
    def broken(inp, w, out_g):
        raise RuntimeError('something else')

    with pytest.raises(RuntimeError, match='something else'):
        check_lin_grads(broken)


def softmax_minus_one_hot(logits, targ):
    return logits.softmax(-1) - F.one_hot(targ, logits.shape[-1]).to(logits.dtype)


def test_ce_grad_accepts_the_right_answer(capsys):
    correct(check_ce_grad, lambda z, t: softmax_minus_one_hot(z, t) / len(t), capsys)


@pytest.mark.parametrize(
    'wrong, message',
    [
        (softmax_minus_one_hot, r'N = 8 times too large: a forgotten 1/N'),
        (lambda z, t: -softmax_minus_one_hot(z, t) / len(t), r'the sign'),
        (lambda z, t: z.softmax(-1) / len(t), r'the one-hot labels are missing'),
        (
            lambda z, t: (z.softmax(0) - F.one_hot(t, 5).double()) / len(t),
            r'over the batch \(dim 0\)',
        ),
        (
            lambda z, t: (z.log_softmax(-1) - F.one_hot(t, 5).double()) / len(t),
            r'log_softmax where softmax belongs',
        ),
        (lambda z, t: softmax_minus_one_hot(z, t) / z.numel(), r'divided by N \* C'),
        (lambda z, t: softmax_minus_one_hot(z, t)[:4] / len(t), r'has shape \(4, 5\)'),
        (
            lambda z, t: 2 * softmax_minus_one_hot(z, t) / len(t),
            r'should be -0.124849; differentiate -z_y',
        ),
    ],
)
def test_ce_grad_names_each_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_ce_grad(wrong)


def test_reused_grad(capsys):
    correct(check_reused_grad, 8, capsys)
    correct(check_reused_grad, torch.tensor(8.0), capsys)
    for wrong, message in (
        (5, 'a \\* a uses a twice'),
        (6, "a \\* a's share alone"),
        (2, "a \\* 2's share alone"),
        (15, "f's value"),
        (7, r'^a.grad = 7 is wrong. Hint'),  # no answer given away
    ):
        with pytest.raises(ExerciseError, match=message):
            check_reused_grad(wrong)


def make_tanh(derivative=lambda t, x: 1 - t**2, assign=False, chain=True, child=True, link=True):
    "A value_tanh, right by default, with one of the usual mistakes on request."

    def value_tanh(v):
        t = math.tanh(v.data)
        out = Value(t, (v,) if child else (), 'tanh')

        def _backward():
            g = derivative(t, v.data) * (out.grad if chain else 1.0)
            if assign:
                v.grad = g
            else:
                v.grad += g

        if link:
            out._backward = _backward
        return out

    return value_tanh


def test_value_tanh_accepts_the_right_answer(capsys):
    correct(check_value_tanh, make_tanh(), capsys)


@pytest.mark.parametrize(
    'wrong, message',
    [
        (make_tanh(derivative=lambda t, x: 1 - t), r'1 - tanh\*\*2, not 1 - tanh'),
        (make_tanh(derivative=lambda t, x: 1 - x**2), r'not 1 - x\*\*2'),
        (make_tanh(chain=False), r'multiplies by out.grad'),
        (make_tanh(assign=True), r'`=` where `\+=` belongs'),
        (make_tanh(child=False), r'does not record v among its children'),
        (make_tanh(link=False), r'nothing passed through value_tanh'),
        (lambda v: Value(math.tanh(v.data) + 1, (v,)), r'\.data is 0.0948517, tanh is -0.905148'),
        (lambda v: math.tanh(v.data), r'should return a Value, got float'),
    ],
)
def test_value_tanh_names_each_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_value_tanh(wrong)

"""Unit tests for exp.matmul: each version of the matrix product against torch.matmul, its
refusals, and the exercise checks of notebook 01b (a right answer passes, the usual mistakes are
named)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from exp.exercises import ExerciseError, check_broadcast_shape, check_matmul_no_loops
from exp.exercises import check_row_dots
from exp.matmul import matmul_broadcast, matmul_einsum, matmul_elementwise, matmul_loops

VERSIONS = [matmul_loops, matmul_elementwise, matmul_broadcast, matmul_einsum]
IDS = [f.__name__ for f in VERSIONS]
sizes = st.integers(0, 6)


@pytest.mark.parametrize('matmul', VERSIONS, ids=IDS)
@settings(max_examples=25, deadline=None)
@given(n=sizes, k=sizes, m=sizes, seed=st.integers(0, 2**16))
def test_each_version_is_torch_matmul(matmul, n, k, m, seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, k, generator=gen), torch.randn(k, m, generator=gen)
    got = matmul(a, b)
    assert got.shape == (n, m) and got.dtype == a.dtype
    assert torch.allclose(got, torch.matmul(a, b), atol=1e-5)


@pytest.mark.parametrize('matmul', VERSIONS, ids=IDS)
@pytest.mark.parametrize('dtype', [torch.float64, torch.int64])
def test_each_version_keeps_the_dtype(matmul, dtype):
    a = torch.arange(12).reshape(3, 4).to(dtype)
    b = torch.arange(8).reshape(4, 2).to(dtype)
    got = matmul(a, b)
    assert got.dtype == dtype
    assert torch.equal(got, torch.matmul(a, b))


def test_on_the_digits():
    from exp.data import get_data

    x = get_data()[2][:3]
    w = torch.randn(784, 10, generator=torch.Generator().manual_seed(0))
    for matmul in VERSIONS:
        assert torch.allclose(matmul(x, w), x @ w, atol=1e-4), matmul.__name__


BAD = [
    ((torch.ones(2, 3), torch.ones(4, 5)), ValueError, 'b must have as many rows as a has columns'),
    (
        (torch.ones(3), torch.ones(3, 2)),
        ValueError,
        r'a must be 2-d \(a matrix\), got shape \(3,\)',
    ),
    (
        (torch.ones(2, 3), torch.ones(3)),
        ValueError,
        r'b must be 2-d \(a matrix\), got shape \(3,\)',
    ),
    ((torch.ones(1, 2, 3), torch.ones(3, 2)), ValueError, r'a must be 2-d'),
    (([[1.0]], torch.ones(1, 1)), TypeError, 'a must be a torch.Tensor, got list'),
    ((torch.ones(1, 1), 2.0), TypeError, 'b must be a torch.Tensor, got float'),
    ((torch.ones(2, 2), torch.ones(2, 2).double()), TypeError, 'b.dtype=torch.float64'),
]


@pytest.mark.parametrize('matmul', VERSIONS, ids=IDS)
def test_operands_that_do_not_multiply_are_refused_in_one_line(matmul):
    for args, error, message in BAD:
        with pytest.raises(error, match=message) as info:
            matmul(*args)
        assert '\n' not in str(info.value)


# ---------------- the exercise checks


def not_answered(*args):
    raise NotImplementedError  # what the notebook's exercise cells hold until they are filled in


def broadcast_shape(sa, sb):
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + tuple(sa), (1,) * (n - len(sb)) + tuple(sb)
    if any(x != y and 1 not in (x, y) for x, y in zip(sa, sb)):
        raise ValueError(f'{sa} and {sb} do not broadcast')
    return tuple(max(x, y) for x, y in zip(sa, sb))


def left_aligned(sa, sb):
    n = max(len(sa), len(sb))
    return broadcast_shape(tuple(sa) + (1,) * (n - len(sa)), tuple(sb) + (1,) * (n - len(sb)))


def no_check(sa, sb):
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + tuple(sa), (1,) * (n - len(sb)) + tuple(sb)
    return tuple(max(x, y) for x, y in zip(sa, sb))


def with_loop(a, b):
    return torch.stack([(a[i, :, None] * b).sum(0) for i in range(len(a))])


CHECKS = [
    (
        check_broadcast_shape,
        [broadcast_shape, lambda sa, sb: torch.Size(broadcast_shape(sa, sb))],
        [
            (left_aligned, 'line the shapes up from the right'),
            (no_check, r'do not broadcast: two sizes that differ, neither of them 1'),
            (lambda sa, sb: tuple(sa), r'should be \(3, 3\)|should be \(5, 5\)'),
            (lambda sa, sb: sa if len(sa) >= len(sb) else sb, 'should be'),
            (lambda sa, sb: 'x', 'should return a tuple of ints'),
            (lambda sa, sb: broadcast_shape(sa, sb)[1:], 'as many dimensions as the longer shape'),
            (
                lambda sa, sb: broadcast_shape(sa, sb) if sa != (5, 1) else no_check(sa, (5, 5, 9)),
                'as many dimensions',
            ),
        ],
    ),
    (
        check_matmul_no_loops,
        [
            lambda a, b: (a[:, :, None] * b[None]).sum(1),
            lambda a, b: (a.unsqueeze(-1) * b).sum(dim=-2),
        ],
        [
            (lambda a, b: a @ b, r"calls \['(__)?matmul(__)?'\]"),
            (lambda a, b: torch.einsum('ik,kj->ij', a, b), "calls \\['einsum'\\]"),
            (with_loop, 'a Python loop'),
            (lambda a, b: (a[:, :, None] * b[None]).sum(1).T, r'that is \(a @ b\)\.T'),
            (
                lambda a, b: (
                    (a[:, :, None] * b[None]).sum(1) if len(a) == 6 else b.T.mul(a.T.sum(0))
                ),
                'is wrong: its element',
            ),
            (
                lambda a, b: (a[:, :, None] * b[None]).sum(1) if len(a) == 6 else a * b,
                'elementwise product',
            ),
            (
                lambda a, b: (
                    (a[:, :, None] * b[None]).sum(1)
                    if len(a) == 6
                    else (b[:, :, None] * a[None]).sum(1)
                ),
                'that is b @ a',
            ),
            (
                lambda a, b: (
                    (a[:, :, None] * b[None]).sum(1)
                    if len(a) == 6
                    else (a[:, :, None] * b[None]).sum(0)
                ),
                "sums over a's rows",
            ),
            (lambda a, b: (a[:, :, None] * b[None]).sum(2), 'should have shape'),
        ],
    ),
    (
        check_row_dots,
        [lambda x, y: torch.einsum('ij,ij->i', x, y), lambda x, y: (x * y).sum(-1)],
        [
            (lambda x, y: torch.einsum('ij,ij->', x, y), "keep i in the result"),
            (lambda x, y: torch.einsum('ij,ij->j', x, y), 'summed over the rows'),
            (lambda x, y: torch.einsum('ik,jk->ij', x, y), r'x @ y\.T'),
            (lambda x, y: x * y, 'not yet summed'),
            (lambda x, y: (x * y).sum(-1) + 1, 'is wrong: its element'),
            (lambda x, y: (x * y).sum(-1).tolist(), 'should be a tensor'),
        ],
    ),
]
CHECK_IDS = [check.__name__ for check, *_ in CHECKS]


@pytest.mark.parametrize('check, solutions, wrongs', CHECKS, ids=CHECK_IDS)
def test_a_right_answer_passes(check, solutions, wrongs, capsys):
    for solution in solutions:
        check(solution)
        assert capsys.readouterr().out.endswith(': correct\n')


@pytest.mark.parametrize('check, solutions, wrongs', CHECKS, ids=CHECK_IDS)
def test_the_usual_mistakes_are_named(check, solutions, wrongs, capsys):
    for wrong, hint in wrongs:
        with pytest.raises(ExerciseError, match=hint):
            check(wrong)
    assert 'correct' not in capsys.readouterr().out


@pytest.mark.parametrize('check', [c for c, *_ in CHECKS], ids=CHECK_IDS)
def test_an_unanswered_exercise_is_reported_not_failed(check, capsys):
    assert check(not_answered) is None
    assert 'not answered yet' in capsys.readouterr().out


def test_an_answer_that_refuses_shapes_that_broadcast_is_told_so():
    def too_strict(sa, sb):
        if len(sa) != len(sb):
            raise ValueError('different lengths')
        return broadcast_shape(sa, sb)

    with pytest.raises(ExerciseError, match=r'raised ValueError \(different lengths\), but'):
        check_broadcast_shape(too_strict)

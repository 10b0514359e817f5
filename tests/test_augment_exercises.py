"""Lesson 14's exercise checks: each passes a reference solution, rejects the known mistakes with
their hint, and reports an exercise not yet answered without failing."""

import pytest
import torch
import torch.nn.functional as F

from exp.exercises import ExerciseError, check_mixup_batch, check_smooth_targets, check_tta_probs


def not_answered(*args, **kwargs):
    raise NotImplementedError  # what the notebook's exercise cells hold until they are filled in


def smooth_targets(y, c, eps):
    return F.one_hot(y, c).float() * (1 - eps) + eps / c


def mixup_batch(x, perm, lam):
    lam = torch.max(lam, 1 - lam).view(-1, 1, 1, 1)
    return lam * x + (1 - lam) * x[perm]


def tta_probs(model, x):
    return (F.softmax(model(x), -1) + F.softmax(model(x.flip(-1)), -1)) / 2


def _raw_mix(x, perm, lam):
    lam = lam.view(-1, 1, 1, 1)
    return lam * x + (1 - lam) * x[perm]


CHECKS = [
    (
        check_smooth_targets,
        smooth_targets,
        [
            (
                lambda y, c, eps: (
                    F.one_hot(y, c) * (1 - eps) + (1 - F.one_hot(y, c)) * eps / (c - 1)
                ),
                'over the other c - 1 classes',
            ),
            (
                lambda y, c, eps: F.one_hot(y, c) * (1 - eps) + (1 - F.one_hot(y, c)) * eps / c,
                "the label's class gets its share",
            ),
            (lambda y, c, eps: F.one_hot(y, c) * (1 - eps), 'each row must sum to 1'),
            (lambda y, c, eps: F.one_hot(y, c).float(), 'is wrong: its element'),
            (lambda y, c, eps: y, 'should have shape'),
        ],
    ),
    (
        check_mixup_batch,
        mixup_batch,
        [
            (_raw_mix, 'take max\\(lam, 1 - lam\\) first'),
            (lambda x, perm, lam: mixup_batch(x[perm], perm.argsort(), lam), 'goes to x itself'),
            (lambda x, perm, lam: mixup_batch(x, perm.argsort(), lam), 'not with the image'),
            (lambda x, perm, lam: x, 'is wrong: its element'),
        ],
    ),
    (
        check_tta_probs,
        tta_probs,
        [
            (
                lambda model, x: F.softmax((model(x) + model(x.flip(-1))) / 2, -1),
                'averages the logits',
            ),
            (lambda model, x: (model(x) + model(x.flip(-1))) / 2, 'those are logits'),
            (
                lambda model, x: (F.softmax(model(x), -1) + F.softmax(model(x.flip(-2)), -1)) / 2,
                'mirrors top to bottom',
            ),
            (lambda model, x: F.softmax(model(x), -1), 'prediction on x alone'),
            (lambda model, x: [0.5], 'should be a tensor'),
        ],
    ),
]
IDS = [check.__name__ for check, *_ in CHECKS]


@pytest.mark.parametrize('check, solution, wrongs', CHECKS, ids=IDS)
def test_reference_solution_passes(check, solution, wrongs, capsys):
    check(solution)
    assert capsys.readouterr().out.endswith(': correct\n')


@pytest.mark.parametrize('check, solution, wrongs', CHECKS, ids=IDS)
def test_wrong_answers_fail_with_a_hint(check, solution, wrongs, capsys):
    for wrong, hint in wrongs:
        with pytest.raises(ExerciseError, match=hint):
            check(wrong)
    assert 'correct' not in capsys.readouterr().out


@pytest.mark.parametrize('check', [c for c, *_ in CHECKS], ids=IDS)
def test_an_unanswered_exercise_is_reported_not_failed(check, capsys):
    assert check(not_answered) is None
    assert 'not answered yet' in capsys.readouterr().out

"""Unit tests for exp.early_stopping: the LR finder leaves the model as it was; early stopping
stops when it should."""

import math

import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn

from exp.anneal import Recorder
from exp.callbacks import AvgStatsCallback, Callback, DataBunch, Learner, Runner
from exp.data import set_seed
from exp.early_stopping import LR_Find, EarlyStopping, LRFinder, TrackerCallback
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Optimizer, Sampler
from exp.optimizers import SGD, Adam


def make_data(n_train=16, n_valid=6, bs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = (
        torch.randn(n_train + n_valid, 5, generator=g),
        torch.randint(0, 3, (n_train + n_valid,), generator=g),
    )
    train_ds, valid_ds = Dataset(x[:n_train], y[:n_train]), Dataset(x[n_train:], y[n_train:])
    return DataBunch(
        DataLoader(train_ds, Sampler(train_ds, bs, shuffle=True, seed=seed)),
        DataLoader(valid_ds, Sampler(valid_ds, bs)),
        c=3,
    )


def make_learner(seed=0, **kwargs):
    set_seed(seed)
    return Learner(
        make_data(), nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)), **kwargs
    )


class Counter(Callback):
    "Counts training and validation batches that reached the loss."

    def begin_fit(self):
        self.train, self.valid = 0, 0

    def after_loss(self):
        if self.in_train:
            self.train += 1
        else:
            self.valid += 1


# ---------------- LR finder


@pytest.mark.parametrize(
    'opt_func',
    [
        lambda ps, lr: SGD(ps, lr=lr, momentum=0.9, weight_decay=1e-2),
        lambda ps, lr: Adam(ps, lr=lr),
    ],
    ids=['sgd', 'adam'],
)
def test_lr_finder_restores_model_and_optimizer(opt_func):
    learn = make_learner(opt_func=opt_func, lr=0.01)
    # so that the optimizer has state (momentum buffers, Adam's averages) to restore
    Runner().fit(1, learn)
    weights = {k: v.clone() for k, v in learn.model.state_dict().items()}
    opt_state = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in learn.opt.state_dict()['state'].items()
    }
    run = Runner(cbs=[LRFinder(max_iter=10, min_lr=1e-3, max_lr=1.0), Recorder()])
    run.fit(3, learn)
    assert len(run.recorder.losses) > 1  # it did train, with other learning rates
    for k, v in learn.model.state_dict().items():
        ft.test_eq(v, weights[k])
    state = learn.opt.state_dict()
    ft.test_eq(state['param_groups'][0]['lr'], 0.01)
    ft.test_eq(sorted(state['state']), sorted(opt_state))
    for i, s in opt_state.items():
        for k, v in s.items():
            ft.test_eq(state['state'][i][k], v)


class FailsToBegin(Callback):
    _order = -1  # before LRFinder (0): its begin_fit never runs

    def begin_fit(self):
        raise ValueError('refused at begin_fit')


def test_lr_finder_lets_an_earlier_begin_fit_error_through():
    """A callback's begin_fit error reaches the caller, not an error of the LRFinder's after_fit,
    which has nothing to restore."""
    learn = make_learner(lr=0.01)
    ft.test_fail(
        lambda: Runner(cbs=[FailsToBegin(), LRFinder(max_iter=10)]).fit(3, learn),
        contains='refused at begin_fit',
    )


def test_lr_finder_schedule_and_max_iter():
    learn = make_learner(lr=0.01)
    run = Runner(cbs=[LRFinder(max_iter=10, min_lr=1e-4, max_lr=1e-2), Recorder(), Counter()])
    run.fit(3, learn)  # 4 batches per epoch: room for 12
    lrs = run.recorder.lrs[0]
    ft.test_eq(len(lrs), 10)  # max_iter batches, no more
    ft.test_close(lrs, [1e-4 * 100 ** (k / 9) for k in range(10)], eps=1e-12)
    ft.test_eq(lrs[0], 1e-4)
    ft.test_close(lrs[-1], 1e-2, eps=1e-15)
    ft.test_eq(run.counter.valid, 0)  # validation skipped
    ft.test_eq(run.n_iter, 9)  # the 10th batch stopped training in its after_step


def test_lr_finder_stops_when_the_loss_explodes():
    learn = make_learner(lr=0.01)
    run = Runner(cbs=[LRFinder(max_iter=100, min_lr=1.0, max_lr=1e8), Recorder()])
    run.fit(30, learn)
    losses = [float(l) for l in run.recorder.losses]
    assert len(losses) < 100
    assert not math.isfinite(losses[-1]) or losses[-1] > 10 * min(losses[:-1]), losses
    assert all(
        math.isfinite(l) and l <= 10 * min(losses[: i + 1]) for i, l in enumerate(losses[:-1])
    )


def test_lr_finder_with_the_hand_written_optimizer():
    learn = make_learner(lr=0.3)
    # no state_dict: its hyperparameters are restored
    learn.opt = Optimizer(learn.model.parameters(), lr=0.3)
    weights = [p.detach().clone() for p in learn.model.parameters()]
    Runner(cbs=[LRFinder(max_iter=5)]).fit(2, learn)
    ft.test_eq(learn.opt.param_groups[0]['lr'], 0.3)
    for p, q in zip(weights, learn.model.parameters()):
        ft.test_eq(p, q.detach())


def test_lr_finder_warns_when_the_fit_is_too_short():
    with pytest.warns(
        UserWarning, match='1 epoch.* of 4 batches cannot reach max_iter=10: fit 3 epochs'
    ):
        Runner(cbs=[LRFinder(max_iter=10)]).fit(1, make_learner())


@pytest.mark.parametrize(
    'kwargs, error, message',
    [
        (dict(max_iter=1), ValueError, 'max_iter must be >= 2, got 1'),
        (dict(max_iter=2.5), TypeError, 'max_iter must be an int'),
        (dict(min_lr=0), ValueError, 'min_lr must be a finite number > 0, got 0'),
        (dict(min_lr=1.0, max_lr=0.5), ValueError, 'min_lr must be < max_lr'),
        (dict(max_lr='1'), TypeError, 'max_lr must be a number'),
    ],
)
def test_lr_finder_checks(kwargs, error, message):
    with pytest.raises(error, match=message):
        LRFinder(**kwargs)


# ---------------- early stopping


class ScriptedStats(AvgStatsCallback):
    "AvgStatsCallback whose epochs report the values of a script instead of the measured ones."

    def __init__(self, column, script):
        super().__init__([accuracy], print_stats=False)
        self.column, self.script = column, script

    def after_epoch(self):
        super().after_epoch()
        self.history[-1][self.column] = self.script[self.epoch]


def scripted_fit(script, column='valid_loss', **kwargs):
    es = EarlyStopping(column, **kwargs)
    run = Runner(cbs=[ScriptedStats(column, script), es])
    run.fit(len(script), make_learner(lr=0.1))
    return es, run


@pytest.mark.parametrize(
    'script, kwargs, stopped, best_epoch',
    [
        (
            [1.0, 0.9, 0.95, 0.92, 0.91, 0.5],
            dict(patience=2),
            3,
            1,
        ),  # two epochs without a new best
        # the wait restarts at a new best
        ([1.0, 0.9, 0.95, 0.89, 0.91, 0.5], dict(patience=2), None, 5),
        # better, but not by more than min_delta
        ([1.0, 0.95, 0.93, 0.8, 0.7], dict(patience=2, min_delta=0.1), 2, 0),
        ([1.0, 0.9, 0.9, 0.9], dict(patience=1), 2, 1),  # equal is not better
        # NaN does not improve, nor stop on its own
        ([1.0, math.nan, 0.99, 0.5], dict(patience=2), None, 3),
        ([1.0, math.nan, math.nan, 0.5], dict(patience=2), 2, 0),
        # a NaN first is not a best that nothing can beat
        ([math.nan, 1.0, 0.9, 0.95, 0.96], dict(patience=2), 4, 2),
        ([math.nan, math.nan, 1.0], dict(patience=2), 1, None),
        ([2.0, 3.0, 4.0], dict(patience=1, mode='max'), None, 2),
        ([2.0, 3.0, 4.0], dict(patience=1), 1, 0),
    ],
)
def test_early_stopping_stops_at_the_right_epoch(script, kwargs, stopped, best_epoch, capsys):
    es, run = scripted_fit(script, **kwargs)
    ft.test_eq(es.stopped_epoch, stopped)
    ft.test_eq(len(run.scripted_stats.history), len(script) if stopped is None else stopped + 1)
    ft.test_eq(es.best_epoch, best_epoch)
    out = capsys.readouterr().out
    if stopped is None:
        ft.test_eq(out, '')
    else:
        assert out.startswith(
            f'EarlyStopping: stopped after epoch {stopped}: valid_loss has not'
        ), out


def test_early_stopping_accuracy_goes_up(capsys):
    es, run = scripted_fit([0.5, 0.6, 0.6, 0.55, 0.9], column='valid_accuracy', patience=2)
    ft.test_eq((es.mode, es.stopped_epoch, es.best, es.best_epoch), ('max', 3, 0.6, 1))
    ft.test_eq(
        capsys.readouterr().out.strip(),
        'EarlyStopping: stopped after epoch 3: valid_accuracy has not risen '
        'by more than 0 for 2 epoch(s) (best 0.6000 after epoch 1)',
    )


def test_early_stopping_on_a_real_fit_prints_after_the_last_row(capsys):
    learn = make_learner(lr=0.05, metrics=[accuracy])
    run = Runner(cbs=[EarlyStopping('train_loss', patience=1, min_delta=10.0)])
    run.fit(10, learn)
    lines = capsys.readouterr().out.splitlines()
    ft.test_eq(len(run.avg_stats.history), 2)  # epoch 0 sets the best; epoch 1 cannot beat it by 10
    ft.test_eq(len(lines), 1 + 2 + 1)  # the header, two rows, the message
    assert lines[-1].startswith(
        'EarlyStopping: stopped after epoch 1: train_loss has not fallen by more than 10'
    )
    es = run.early_stopping
    ft.test_eq(es.best, run.avg_stats.history[0]['train_loss'])
    run.fit(1, learn)  # a new fit starts afresh
    ft.test_eq((es.stopped_epoch, es.best_epoch), (None, 0))


def test_early_stopping_needs_avg_stats_and_a_known_monitor():
    with pytest.raises(ValueError, match='needs an AvgStatsCallback to read'):
        Runner(cbs=[EarlyStopping()]).fit(1, make_learner())
    with pytest.raises(
        ValueError,
        match="monitor='valid_acc' is not a column of AvgStatsCallback's history; "
        "it has: train_loss, train_accuracy, valid_loss, valid_accuracy",
    ):
        Runner(cbs=[EarlyStopping('valid_acc')]).fit(1, make_learner(metrics=[accuracy]))


@pytest.mark.parametrize(
    'monitor, mode',
    [
        ('valid_loss', 'min'),
        ('train_loss', 'min'),
        ('valid_accuracy', 'max'),
        ('valid_error_rate', 'min'),
        ('valid_f1', 'max'),
        ('valid_mse', 'min'),
    ],
)
def test_early_stopping_auto_mode(monitor, mode):
    ft.test_eq(EarlyStopping(monitor).mode, mode)


@pytest.mark.parametrize(
    'kwargs, error, message',
    [
        (dict(monitor='valid_kappa'), ValueError, "give mode='min' or 'max'"),
        (dict(mode='up'), ValueError, "mode must be 'auto'"),
        (dict(patience=0), ValueError, 'patience must be >= 1, got 0'),
        (dict(patience=1.5), TypeError, 'patience must be an int'),
        (dict(min_delta=-0.1), ValueError, 'min_delta must be a number >= 0, got -0.1'),
        (dict(monitor='epoch'), ValueError, "monitor='epoch' is not a metric"),
        (dict(monitor=3), TypeError, 'monitor must be'),
    ],
)
def test_early_stopping_checks(kwargs, error, message):
    with pytest.raises(error, match=message):
        EarlyStopping(**kwargs)


def test_the_courses_lr_find(capsys):
    """course-v3's 05b: Runner(cb_funcs=[LR_Find, Recorder]).fit(2, learn), then
    recorder.plot(skip_last=5)."""
    learn = make_learner(lr=0.1)
    weights = {k: v.clone() for k, v in learn.model.state_dict().items()}
    run = Runner(cb_funcs=[LR_Find, Recorder])
    run.fit(25, learn)
    assert isinstance(run.lr_finder, LRFinder) and 1 < len(run.recorder.losses) <= 100
    ft.test_close(run.recorder.lrs[0][0], 1e-6)
    for k, v in learn.model.state_dict().items():
        ft.test_eq(v, weights[k])


# ---------------- the tracker


def test_tracker_keeps_the_best_and_a_nan_never_is_it():
    tracker = TrackerCallback('valid_loss', min_delta=0.05)
    # with no best yet, only a number counts
    assert not tracker.improved(math.nan) and tracker.improved(3.0)
    run = Runner(cbs=[ScriptedStats('valid_loss', [math.nan, 1.0, 0.97, 0.9, math.nan]), tracker])
    news = []
    run.add_cbs(
        [
            type(
                'Watch',
                (Callback,),
                {
                    'run_after': (TrackerCallback,),
                    'after_epoch': lambda self: news.append(self.tracker.new_best),
                },
            )()
        ]
    )
    run.fit(5, make_learner(lr=0.1))
    ft.test_eq(news, [False, True, False, True, False])
    ft.test_eq((tracker.best, tracker.best_epoch), (0.9, 3))


def test_tracker_and_early_stopping_state():
    es, _ = scripted_fit([1.0, 0.9, 0.95, 0.97], patience=5)
    state = es.state_dict()
    ft.test_eq(state, {'best': 0.9, 'best_epoch': 1, 'wait': 2})
    other = EarlyStopping(patience=5)
    other.load_state_dict(state)
    ft.test_eq((other.best, other.best_epoch, other.wait), (0.9, 1, 2))
    for bad in (
        {'best': math.nan, 'best_epoch': 1, 'wait': 0},
        {'best': 0.5, 'best_epoch': None, 'wait': 0},
        {'best': 0.5, 'best_epoch': 1, 'wait': -1},
        {'best': 0.5, 'best_epoch': 1},
        None,
    ):
        with pytest.raises(ValueError, match='state holds'):
            other.load_state_dict(bad)
    # a refused state changes nothing
    ft.test_eq((other.best, other.best_epoch, other.wait), (0.9, 1, 2))
    fresh = TrackerCallback()
    fresh.load_state_dict({'best': None, 'best_epoch': None})
    ft.test_eq(fresh.state_dict(), {'best': None, 'best_epoch': None})

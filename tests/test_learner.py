"""Unit tests for exp.learner: the Learner's methods, checkpoints and exact resume."""

import math
import os
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn, optim

import exp.learner  # noqa: F401  (patches the Learner)
from exp.callbacks import AvgStatsCallback, Callback, CancelEpochException, DataBunch, Learner
from exp.data import set_seed
from exp.early_stopping import EarlyStopping
from exp.fp16 import MixedPrecision
from exp.learner import SaveModelCallback, suggest_lr
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD, Adam


def make_data(n=480, bs=32, seed=0):
    "Gaussian blobs, 4 classes: learnable in a few epochs of a small MLP."
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 20, generator=g) * 2
    y = torch.randint(0, 4, (n,), generator=g)
    x = centres[y] + torch.randn(n, 20, generator=g)
    train_ds, valid_ds = (
        Dataset(x[: n * 3 // 4], y[: n * 3 // 4]),
        Dataset(x[n * 3 // 4 :], y[n * 3 // 4 :]),
    )
    return DataBunch(
        DataLoader(train_ds, Sampler(train_ds, bs, shuffle=True)),
        DataLoader(valid_ds, Sampler(valid_ds, bs)),
        c=4,
    )


def make_learner(seed=0, fp16=False, metrics=(accuracy,)):
    set_seed(seed)
    learn = Learner(
        make_data(),
        nn.Sequential(nn.Linear(20, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)),
        metrics=list(metrics),
        lr=0.2,
        opt_func=lambda ps, lr: SGD(ps, lr=lr, momentum=0.9),
    )
    learn.display = 'off'
    return learn.to_fp16(loss_scale=2.0**10, max_noskip=5) if fp16 else learn


def params(learn):
    return [p.detach().clone() for p in learn.model.parameters()]


class StopAfter(Callback):
    _order = 50

    def __init__(self, epoch):
        self.stop = epoch

    def after_epoch(self):
        if self.epoch == self.stop:
            raise KeyboardInterrupt


# ---------------- fit and friends


def test_fit_returns_runner_with_recorder_and_history(capsys):
    learn = make_learner()
    run = learn.fit(2)
    assert run is learn.run and learn.recorder is run.recorder
    ft.test_eq(len(run.avg_stats.history), 2)
    ft.test_eq(len(learn.recorder.losses), 2 * len(learn.data.train_dl))
    assert run.avg_stats.history[-1]['valid_accuracy'] > 0.8


def test_fit_one_cycle_schedules_lr_and_momentum():
    learn = make_learner()
    learn.fit_one_cycle(2, max_lr=0.4)
    lrs = learn.recorder.lrs[0]
    ft.test_close(max(lrs), 0.4, eps=0.02)
    assert lrs[0] < 0.05 and lrs[-1] < 0.01 and lrs.index(max(lrs)) < len(lrs) // 2
    # back up at the end of the cycle
    ft.test_close(learn.opt.param_groups[0]['momentum'], 0.95, eps=1e-3)


def test_fit_one_cycle_with_adam_schedules_beta1():
    learn = make_learner()
    learn.opt = Adam(learn.model.parameters(), lr=0.01)
    learn.fit_one_cycle(1, max_lr=0.01)
    beta1 = learn.opt.param_groups[0]['betas'][0]
    assert 0.9 < beta1 < 0.95  # moved from Adam's 0.9, back towards 0.95 at the end of the cycle


def test_validate_and_predict():
    learn = make_learner()
    learn.fit(2)
    res = learn.validate()
    ft.test_eq(sorted(res), ['valid_accuracy', 'valid_loss'])
    ft.test_close(res['valid_loss'], learn.run.avg_stats.history[-1]['valid_loss'], eps=1e-6)
    x, y = learn.data.valid_ds.x, learn.data.valid_ds.y
    ft.test_close((learn.predict(x) == y).float().mean().item(), res['valid_accuracy'], eps=1e-6)


def test_lr_find_leaves_weights_and_optimizer_unchanged():
    for fp16 in (False, True):
        learn = make_learner(fp16=fp16)
        learn.fit(1)
        before, opt_before = (
            params(learn),
            {
                k: v.clone()
                for k, v in learn.opt.state[learn.opt.param_groups[0]['params'][0]].items()
            },
        )
        lr = learn.lr_find(max_iter=30)
        assert 1e-6 <= lr <= 1.0
        for p, q in zip(before, learn.model.parameters()):
            ft.test_eq(p, q.detach())
        state = learn.opt.state[learn.opt.param_groups[0]['params'][0]]
        for k in opt_before:
            ft.test_eq(opt_before[k], state[k])
        ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
        assert len(learn.recorder.losses) <= 30


def test_suggest_lr():
    lrs = [10 ** (-6 + i * 0.1) for i in range(60)]
    losses = [2.0 - i * 0.02 for i in range(40)] + [1.2 + (i * 0.3) ** 2 for i in range(20)]
    # the bias-corrected smoothed loss in closed form: sum_j beta^(i-j) (1 - beta) loss_j / (1 -
    # beta^(i+1))
    i = torch.arange(60, dtype=torch.float64)
    weights = torch.where(i[None, :] <= i[:, None], 0.9 ** (i[:, None] - i[None, :]) * 0.1, 0.0)
    smoothed = weights @ torch.tensor(losses, dtype=torch.float64) / (1 - 0.9 ** (i + 1))
    best = int(smoothed.argmin())
    # the smoothing lags the raw minimum (index 40): a suggestion from the raw losses would differ
    assert best > 40
    ft.test_eq(suggest_lr(lrs, losses), lrs[best] / 10)
    with pytest.raises(ValueError, match='as many lrs as losses'):
        suggest_lr([1e-3], [])
    for beta in (1, -0.1, True):
        with pytest.raises(ValueError, match=f'beta must be in \\[0, 1\\), got {beta!r}'):
            suggest_lr(lrs, losses, beta=beta)
    # tensors too
    ft.test_eq(
        suggest_lr(
            torch.tensor(lrs, dtype=torch.float64), torch.tensor(losses, dtype=torch.float64)
        ),
        suggest_lr(lrs, losses),
    )


def test_a_finder_whose_every_loss_is_nan_suggests_nothing():
    # the first lr's tenth (1e-7) came back, suggested from no finite loss at all
    with pytest.raises(
        ValueError, match=r'losses\[0\] is nan \(at lr 1e-06\): with no finite loss'
    ):
        suggest_lr([1e-6, 1e-5], [math.nan, math.nan])
    learn = make_learner()
    with torch.no_grad():
        learn.model[0].weight.fill_(math.nan)
    with pytest.raises(ValueError, match='no lr to suggest'):
        learn.lr_find(max_iter=20)


def test_lr_find_on_a_loader_without_batches_says_so():
    learn = make_learner()
    learn.data = DataBunch([], learn.data.valid_dl, 4)  # a ZeroDivisionError before
    with pytest.raises(ValueError, match=r'learn.data.train_dl gives no batches \(len 0\)'):
        learn.lr_find(max_iter=20)


def test_predict_with_a_model_without_parameters():
    learn = make_learner()
    learn.model = nn.Flatten()  # next(parameters()) raised StopIteration
    x = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]])
    ft.test_eq(learn.predict(x), torch.tensor([1, 0]))


def test_to_fp16_to_bf16_to_fp32_chain():
    learn = make_learner()
    assert learn.to_fp16() is learn and isinstance(learn.cbs[-1], MixedPrecision)
    assert learn.to_bf16().cbs[-1].dtype == torch.bfloat16 and len(learn.cbs) == 1
    assert learn.to_fp32() is learn and not learn.cbs


# ---------------- checkpoints


def test_save_load_round_trip(tmp_path):
    learn = make_learner(fp16=True)
    learn.fit(2, cbs=[SaveModelCallback(tmp_path / 'a.pth')])
    state = torch.load(tmp_path / 'a.pth', weights_only=True)
    ft.test_eq(
        (state['epoch'], state['epochs'], state['n_iter']), (1, 2, 2 * len(learn.data.train_dl))
    )
    ft.test_eq(state['version'], 2)
    ft.test_eq(
        state['callbacks']['mixed_precision'],
        {
            'loss_scale': learn.cbs[0].loss_scale,
            'noskip': learn.cbs[0].noskip,
            # the scaler's own state_dict
            'skipped': learn.cbs[0].skipped,
        },
    )
    ft.test_eq(
        sorted(state['callbacks']), ['avg_stats', 'mixed_precision', 'recorder', 'save_model']
    )
    other = make_learner(seed=1, fp16=True)
    other.load(tmp_path / 'a.pth')
    for p, q in zip(learn.model.parameters(), other.model.parameters()):
        ft.test_eq(p.detach(), q.detach())
    for p, q in zip(learn.model.parameters(), other.model.parameters()):
        ft.test_eq(learn.opt.state[p]['momentum_buffer'], other.opt.state[q]['momentum_buffer'])
    ft.test_eq(other.cbs[0].loss_scale, learn.cbs[0].loss_scale)
    # the RNG states come back too
    torch.rand(3)
    other.load(tmp_path / 'a.pth')
    a = torch.rand(3)
    other.load(tmp_path / 'a.pth')
    ft.test_eq(torch.rand(3), a)


def test_checkpoint_in_the_middle_of_fp16_holds_fp32_masters(tmp_path):
    for flat in (False, True):
        learn = make_learner(fp16=True)
        learn.cbs[0].flat_master = flat

        class Grab(Callback):
            _order = 200

            def after_epoch(self):
                self.masters = torch.cat(
                    [m.detach().reshape(-1) for pg in self.mixed_precision.master_pgs for m in pg]
                )
                self.learn.save(tmp_path / 'mid.pth')

        grab = Grab()
        learn.fit(1, cbs=[grab])
        saved = torch.load(tmp_path / 'mid.pth', weights_only=True)
        weights = torch.cat(
            [saved['model'][n].reshape(-1) for n, _ in learn.model.named_parameters()]
        )
        ft.test_eq(weights, grab.masters)
        assert all(
            v.dtype == torch.float32 for v in saved['model'].values() if v.is_floating_point()
        )


def test_resume_is_bit_identical(tmp_path):
    for fp16 in (False, True):
        straight = make_learner(fp16=fp16)
        straight.fit_one_cycle(4)
        crashed = make_learner(fp16=fp16)
        with pytest.raises(KeyboardInterrupt):
            crashed.fit_one_cycle(4, cbs=[SaveModelCallback(tmp_path / 'r.pth'), StopAfter(1)])
        resumed = make_learner(fp16=fp16)
        set_seed(999)
        resumed.fit_one_cycle(4, resume=tmp_path / 'r.pth')
        for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
            ft.test_eq(p.detach(), q.detach())
        # the table and the plots cover all 4 epochs: those before the crash come from the
        # checkpoint
        no_time = lambda run: [
            {k: v for k, v in row.items() if k != 'time'} for row in run.avg_stats.history
        ]
        ft.test_eq(no_time(resumed.run), no_time(straight.run))
        ft.test_eq(resumed.recorder.lrs, straight.recorder.lrs)
        ft.test_eq(torch.stack(resumed.recorder.losses), torch.stack(straight.recorder.losses))


def test_interrupt_message_and_usable_model(tmp_path, capsys):
    learn = make_learner(fp16=True)
    with pytest.raises(KeyboardInterrupt) as info:
        learn.fit(3, cbs=[SaveModelCallback(tmp_path / 'c.pth'), StopAfter(1)])
    (note,) = info.value.__notes__  # shown under the traceback; printed nothing
    assert 'Interrupted during epoch 1' in note and str(tmp_path / 'c.pth') in note
    ft.test_eq(capsys.readouterr().err, '')
    ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
    learn.predict(learn.data.valid_ds.x)  # usable


def test_save_model_on_improvement_only(tmp_path):
    learn = make_learner()
    # some label noise: the valid loss goes up again
    learn.data.valid_ds.y[:20] = (learn.data.valid_ds.y[:20] + 1) % 4
    cb = SaveModelCallback(tmp_path / 'best.pth', every='improvement', monitor='valid_loss')
    learn.fit(4, cbs=[cb])
    history = [row['valid_loss'] for row in learn.run.avg_stats.history]
    best_epoch = min(range(4), key=lambda i: history[i])
    ft.test_eq(torch.load(tmp_path / 'best.pth', weights_only=True)['epoch'], best_epoch)
    ft.test_eq(cb.best, history[best_epoch])
    with pytest.raises(ValueError, match="every must be 'epoch' or 'improvement'"):
        SaveModelCallback('x', every='batch')
    with pytest.raises(ValueError, match='needs an AvgStatsCallback'):
        make_learner(metrics=()).fit(
            1, cbs=[SaveModelCallback(tmp_path / 'x.pth', every='improvement')]
        )


def test_resume_needs_a_fit_checkpoint(tmp_path):
    learn = make_learner()
    learn.save(tmp_path / 'plain.pth')
    with pytest.raises(ValueError, match='was not saved during a fit'):
        learn.fit(2, resume=tmp_path / 'plain.pth')
    with pytest.raises(FileNotFoundError, match='no checkpoint at'):
        learn.load(tmp_path / 'missing.pth')


def test_load_refuses_a_crafted_pickle(tmp_path):
    marker = tmp_path / 'pwned'

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), 'w'))

    torch.save({'version': 1, 'model': Evil()}, tmp_path / 'evil.pth')
    with pytest.raises(ValueError, match='refused to unpickle'):
        make_learner().load(tmp_path / 'evil.pth')
    assert not marker.exists()
    torch.save({'something': 'else'}, tmp_path / 'other.pth')
    with pytest.raises(
        ValueError, match='not a checkpoint this library wrote: it has no version between 1 and 2'
    ):
        make_learner().load(tmp_path / 'other.pth')


FIXTURES = Path(__file__).parent / 'fixtures'


def v1_learner():
    "The learner that wrote tests/fixtures/checkpoint_v1.pth, with the version 1 format's save."
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 5, generator=g), torch.randint(0, 3, (48,), generator=g)
    train_ds, valid_ds = Dataset(x[:32], y[:32]), Dataset(x[32:], y[32:])
    data = DataBunch(
        DataLoader(train_ds, Sampler(train_ds, 8, shuffle=True, seed=3)),
        DataLoader(valid_ds, Sampler(valid_ds, 8)),
        c=3,
    )
    set_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3))
    learn = Learner(data, model, lr=0.1, opt_func=partial(SGD, momentum=0.9), metrics=[accuracy])
    learn.display = 'off'
    return learn.to_fp16(loss_scale=2.0**10, max_noskip=3)


def test_a_version_1_checkpoint_loads_and_resumes(capsys):
    """checkpoint_v1.pth: `v1_learner().fit(2, cbs=[SaveModelCallback(path)])` stopped after epoch
    0, saved by the code of the version 1 format; checkpoint_v1_straight.pth: the model after the
    same fit run straight through, by that code."""
    path = FIXTURES / 'checkpoint_v1.pth'
    ft.test_eq(torch.load(path, weights_only=True)['version'], 1)
    learn = v1_learner()
    state = learn.load(path)
    ft.test_eq((state['version'], state['epoch']), (2, 0))  # read as version 2
    # the scaler, loaded
    ft.test_eq(learn.cbs[0].state_dict(), {'loss_scale': 2048.0, 'noskip': 1, 'skipped': 0})
    ft.test_eq(sorted(state['callbacks']), ['avg_stats', 'mixed_precision', 'recorder'])
    resumed = v1_learner()
    resumed.fit(2, resume=path)
    straight = torch.load(FIXTURES / 'checkpoint_v1_straight.pth', weights_only=True)
    for k, v in resumed.model.state_dict().items():
        ft.test_close(v.float(), straight[k].float(), eps=1e-5)
    rows = resumed.run.avg_stats.history
    ft.test_eq([r['epoch'] for r in rows], [0, 1])
    # epoch 0's row from the old checkpoint
    ft.test_eq(rows[0], state['callbacks']['avg_stats']['history'][0])
    ft.test_eq(len(resumed.recorder.losses), 2 * len(resumed.data.train_dl))


def test_other_versions_are_refused_with_a_clear_message(tmp_path):
    learn = make_learner()
    learn.save(tmp_path / 'a.pth')
    state = torch.load(tmp_path / 'a.pth', weights_only=True)
    for version, message in (
        (
            3,
            'a version 3 checkpoint, written by a newer version of this library; this one reads '
            'versions 1 to 2',
        ),
        (0, 'has no version between 1 and 2'),
        (True, 'has no version between 1 and 2'),
        ('2', 'has no version between 1 and 2'),
    ):
        torch.save({**state, 'version': version}, tmp_path / 'b.pth')
        with pytest.raises(ValueError, match=message):
            learn.load(tmp_path / 'b.pth')


def test_callbacks_own_their_checkpoint_state(tmp_path):
    learn = make_learner()
    cb = SaveModelCallback(tmp_path / 'a.pth', every='improvement')
    learn.fit(2, cbs=[cb, EarlyStopping(patience=3)])
    saved = torch.load(tmp_path / 'a.pth', weights_only=True)['callbacks']
    ft.test_eq(sorted(saved), ['avg_stats', 'early_stopping', 'recorder', 'save_model'])
    ft.test_eq(saved['save_model'], {'best': cb.best, 'best_epoch': cb.best_epoch})
    ft.test_eq(set(saved['early_stopping']), {'best', 'best_epoch', 'wait'})
    ft.test_eq(saved['recorder']['losses'].shape, (len(saved['recorder']['lrs'][0]),))
    ft.test_eq(len(saved['avg_stats']['history']), cb.best_epoch + 1)  # written at the best epoch
    plain = make_learner()
    plain.save(tmp_path / 'plain.pth')  # no fit: nothing recorded
    ft.test_eq(torch.load(tmp_path / 'plain.pth', weights_only=True)['callbacks'], {})


class Script(Callback):
    """Replace the monitored column of each epoch's row by the next value of `values`, before the
    trackers read it."""

    run_after, run_before = (AvgStatsCallback,), (SaveModelCallback, EarlyStopping)

    def __init__(self, values):
        self.values = values

    def after_epoch(self):
        self.avg_stats.history[-1]['valid_loss'] = self.values[self.epoch]


def test_a_nan_first_epoch_never_becomes_the_best(tmp_path):
    """The defect: a NaN in the first epoch became the best, and then no epoch could beat it, so
    nothing was saved again."""

    class NoValidation(Callback):
        def begin_validate(self):
            # epoch 0 has no validation: its valid_loss is NaN
            if self.epoch == 0:
                raise CancelEpochException()

    learn = make_learner()
    cb = SaveModelCallback(tmp_path / 'best.pth', every='improvement')
    learn.fit(3, cbs=[NoValidation(), cb])
    history = [row['valid_loss'] for row in learn.run.avg_stats.history]
    assert math.isnan(history[0]) and not math.isnan(cb.best)
    best_epoch = min((1, 2), key=lambda i: history[i])
    ft.test_eq((cb.best, cb.best_epoch), (history[best_epoch], best_epoch))
    ft.test_eq(torch.load(tmp_path / 'best.pth', weights_only=True)['epoch'], best_epoch)


def test_a_resumed_run_keeps_the_trackers_best(tmp_path):
    "Stopped after a best epoch and resumed, a worse epoch is not saved as a new best."
    path = tmp_path / 'best.pth'
    learn = make_learner()
    with pytest.raises(KeyboardInterrupt):
        learn.fit(
            3,
            cbs=[
                Script([1.0, 0.5, 0.9]),
                SaveModelCallback(path, every='improvement'),
                StopAfter(1),
            ],
        )
    ft.test_eq(torch.load(path, weights_only=True)['epoch'], 1)
    resumed = make_learner()
    cb = SaveModelCallback(path, every='improvement')
    resumed.fit(3, cbs=[Script([1.0, 0.5, 0.9]), cb], resume=path)
    # epoch 2 (0.9) is not better than 0.5
    ft.test_eq((cb.best, cb.best_epoch, cb.last_saved), (0.5, 1, None))
    ft.test_eq(torch.load(path, weights_only=True)['epoch'], 1)


def test_show_events_of_a_typical_learner(tmp_path, capsys):
    learn = make_learner(fp16=True)
    learn.fit_one_cycle(
        1,
        cbs=[SaveModelCallback(tmp_path / 'a.pth', every='improvement'), EarlyStopping(patience=2)],
    )
    capsys.readouterr()
    learn.run.show_events()
    table = {
        line[:20].strip(): line[20:].split(', ') for line in capsys.readouterr().out.splitlines()
    }
    ft.test_eq(
        table,
        {
            'begin_fit': [
                'TrainEvalCallback',
                'Recorder',
                'ProgressCallback',
                'TerminateOnNaNCallback',
                'ParamScheduler',
                'ParamScheduler',
                'AvgStatsCallback',
                'SaveModelCallback',
                'EarlyStopping',
                'MixedPrecision',
            ],
            'begin_epoch': [
                'TrainEvalCallback',
                'ProgressCallback',
                'TerminateOnNaNCallback',
                'ParamScheduler',
                'ParamScheduler',
                'AvgStatsCallback',
            ],
            'begin_batch': ['ParamScheduler', 'ParamScheduler', 'MixedPrecision'],
            'after_pred': ['MixedPrecision'],
            'after_loss': [
                'Recorder',
                'TerminateOnNaNCallback',
                'AvgStatsCallback',
                'MixedPrecision',
            ],
            'after_backward': ['MixedPrecision'],
            'after_step': ['MixedPrecision'],
            'after_batch': ['TrainEvalCallback', 'ProgressCallback'],
            'begin_validate': [
                'TrainEvalCallback',
                'Recorder',
                'ProgressCallback',
                'TerminateOnNaNCallback',
            ],
            'after_epoch': [
                'Recorder',  # the epoch's validation loss
                'TerminateOnNaNCallback',
                'AvgStatsCallback',
                'SaveModelCallback',
                'EarlyStopping',
            ],
            'after_fit': ['MixedPrecision', 'ProgressCallback'],  # teardown in reverse
            'after_cancel_batch': ['-'],
            'after_cancel_step': ['-'],
            'after_cancel_epoch': ['-'],
            'after_cancel_train': ['EarlyStopping'],
        },
    )


def test_fit_one_cycle_takes_fastai_v1s_arguments():
    learn = make_learner()
    # cyc_len, max_lr, moms, div_factor, pct_start: by position
    learn.fit_one_cycle(2, 0.4, (0.9, 0.8), 20.0, 0.25)
    lrs, n = learn.recorder.lrs[0], len(learn.recorder.lrs[0])
    ft.test_close(lrs[0], 0.4 / 20)
    ft.test_close(max(lrs), 0.4, eps=1e-3)
    ft.test_eq(lrs.index(max(lrs)), round(0.25 * n))
    lr_sched, mom_sched = (
        next(cb for cb in learn.run.cbs if getattr(cb, 'pname', None) == name)
        for name in ('lr', 'momentum')
    )
    ft.test_close(
        [lr_sched.sched_funcs[0](pos) for pos in (0.0, 0.25, 1.0)],
        [0.4 / 20, 0.4, 0.4 / (20 * 1e4)],
        eps=1e-9,
    )
    ft.test_close(
        [mom_sched.sched_funcs[0](pos) for pos in (0.0, 0.25, 1.0)], [0.9, 0.8, 0.9], eps=1e-9
    )
    learn = make_learner()
    learn.fit_one_cycle(1, max_lr=0.4, final_div=100.0)
    lr_sched = next(cb for cb in learn.run.cbs if getattr(cb, 'pname', None) == 'lr')
    # v1's div_factor 25
    ft.test_close(
        [lr_sched.sched_funcs[0](pos) for pos in (0.0, 1.0)], [0.4 / 25, 0.4 / 100], eps=1e-9
    )
    for kwargs, message in (
        (dict(moms=0.9), 'moms must be two numbers'),
        (dict(div_factor=0), 'div_factor must be a number > 0'),
        (dict(final_div='x'), 'final_div must be a number > 0'),
        (dict(moms=(1.5, -1)), r'moms must be in \[0, 1\), got \(1.5, -1\)'),
    ):
        with pytest.raises(ValueError, match=message):
            make_learner().fit_one_cycle(1, **kwargs)


def test_learner_cb_funcs():
    "course-v3's Learner(..., cb_funcs=...): each is called to make a callback of the learner."
    learn = Learner(
        make_data(),
        nn.Linear(20, 4),
        cb_funcs=[partial(AvgStatsCallback, [accuracy], print_stats=False), Callback],
    )
    ft.test_eq([type(cb) for cb in learn.cbs], [AvgStatsCallback, Callback])
    learn = Learner(
        make_data(),
        nn.Linear(20, 4),
        cbs=[StopAfter(5)],
        cb_funcs=partial(AvgStatsCallback, [accuracy]),
    )
    ft.test_eq([type(cb) for cb in learn.cbs], [StopAfter, AvgStatsCallback])
    learn.display = 'off'
    learn.fit(1)
    # the learner's own, not a second one for metrics
    ft.test_eq(learn.run.find(AvgStatsCallback), learn.cbs[1])
    with pytest.raises(TypeError, match='cb_funcs must be callables'):
        Learner(make_data(), nn.Linear(20, 4), cb_funcs=[StopAfter(1)])


def test_to_fp16_takes_loss_fp32():
    learn = make_learner().to_fp16(loss_fp32=False)
    assert learn.cbs[0].loss_fp32 is False and make_learner().to_fp16().cbs[0].loss_fp32 is True


def test_only_rank_0_writes_a_checkpoint(tmp_path):
    learn = make_learner()
    learn.rank = 1  # as to_distributed sets it on the other processes
    ft.test_eq(learn.save(tmp_path / 'a.pth'), tmp_path / 'a.pth')
    assert not (tmp_path / 'a.pth').exists()


KILL_DURING_SAVE = textwrap.dedent('''
    import os, signal, sys, torch
    sys.path.insert(0, {tests!r})
    import exp.learner
    from test_learner import make_learner
    learn = make_learner()
    learn.fit(1)
    learn.save({path!r})  # the good checkpoint
    torch.save(learn.model.state_dict(), {path!r} + '.expected')
    learn.fit(1)  # the weights move on
    def killed_before_rename(src, dst): os.kill(os.getpid(), signal.SIGKILL)
    os.replace = killed_before_rename
    learn.save({path!r})  # written to a temporary file, then killed before the rename
    ''')


def test_kill_during_save_leaves_the_old_checkpoint(tmp_path):
    path = str(tmp_path / 'ckpt.pth')
    script = KILL_DURING_SAVE.format(tests=os.path.dirname(__file__), path=path)
    proc = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr  # SIGKILL
    assert list(tmp_path.glob('.ckpt.pth.*.part')), (
        'the interrupted save should have written its temporary file'
    )
    learn = make_learner(seed=5)
    learn.load(path)
    expected = torch.load(path + '.expected', weights_only=True)
    for k, v in learn.model.state_dict().items():
        ft.test_eq(v, expected[k])


def test_checkpoint_with_the_hand_written_optimizer(tmp_path):
    from exp.minibatch import Optimizer

    learn = make_learner()
    learn.opt = Optimizer(learn.model.parameters(), lr=0.05)
    learn.fit(1, cbs=[SaveModelCallback(tmp_path / 'h.pth')])
    learn.opt.param_groups[0]['lr'] = 1.0
    learn.load(tmp_path / 'h.pth')
    ft.test_eq(learn.opt.param_groups[0]['lr'], 0.05)
    assert 1e-6 <= learn.lr_find(max_iter=20) <= 1.0
    ft.test_eq(learn.opt.param_groups[0]['lr'], 0.05)


@pytest.mark.slow
def test_the_seeds_example_as_written():
    """fastai v1's example as written, on mnist_sample()'s default, MNIST's 3s and 7s: seed 0 gives
    0.968 (seeds 0-9: 0.962-0.968); threshold 0.96."""
    from exp.cnn import mnist_sample, simple_cnn

    set_seed(0)
    # downloads MNIST once
    learn = Learner(mnist_sample(), simple_cnn((1, 16, 16, 2)), metrics=[accuracy]).to_fp16()
    learn.display = 'off'
    learn.fit_one_cycle(1)
    ft.test_eq(len(learn.data.train_ds), 12396)
    assert learn.run.avg_stats.history[-1]['valid_accuracy'] >= 0.96
    assert {p.dtype for p in learn.model.parameters()} == {torch.float32}


# ---------------- checkpoints under faults

import copy
import random
import zipfile

import numpy as np

from exp.callbacks import NonFiniteError
from exp.learner import CheckpointMismatch, TerminateOnNaNCallback


def everything(learn) -> dict:
    """Every state a load could change: model, optimizer, the learner's callbacks, the global RNGs,
    the samplers."""
    return {
        'model': {k: v.clone() for k, v in learn.model.state_dict().items()},
        'opt': copy.deepcopy(learn.opt.state_dict()),
        'cbs': [copy.deepcopy(cb.state_dict()) for cb in learn.cbs],
        'torch': torch.get_rng_state(),
        'python': random.getstate(),
        'numpy': np.random.get_state(),
        'data': learn.data.state_dict(),
        'dtypes': [p.dtype for p in learn.model.parameters()],
    }


def same(a, b) -> bool:
    "Equal, through dicts, lists, tuples, numpy arrays and tensors."
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.fixture
def saved(tmp_path) -> tuple[Path, bytes]:
    "A checkpoint of a two-epoch fp16 fit (its callbacks' states included), and its bytes."
    learn = make_learner(fp16=True)
    learn.fit(2, cbs=[SaveModelCallback(tmp_path / 'good.pth')])
    path = tmp_path / 'good.pth'
    return path, path.read_bytes()


def test_a_flipped_bit_anywhere_is_refused(saved, tmp_path):
    path, raw = saved
    learn = make_learner(seed=3, fp16=True)
    learn.fit(1)
    before = everything(learn)
    positions = sorted(
        {*range(0, len(raw), max(1, len(raw) // 150)), *range(len(raw) - 120, len(raw))}
    )
    loaded_by_torch = 0
    for i in positions:
        bad = bytearray(raw)
        bad[i] ^= 1 << (i % 8)
        (tmp_path / 'bad.pth').write_bytes(bad)
        with pytest.raises(ValueError, match='bad.pth is (damaged|truncated)'):
            learn.load(tmp_path / 'bad.pth')
        try:
            torch.load(tmp_path / 'bad.pth', weights_only=True)
            loaded_by_torch += 1
        except Exception:
            pass
    assert loaded_by_torch > len(positions) // 2  # what torch alone would have taken as weights
    assert same(everything(learn), before)


@pytest.mark.parametrize('keep', [0, 1, 100, 0.5, -1])
def test_a_truncated_or_empty_checkpoint_is_one_line_naming_the_file(saved, tmp_path, keep):
    path, raw = saved
    n = len(raw) - 1 if keep == -1 else int(len(raw) * keep) if isinstance(keep, float) else keep
    (tmp_path / 'cut.pth').write_bytes(raw[:n])
    with pytest.raises(ValueError) as info:
        make_learner(fp16=True).load(tmp_path / 'cut.pth')
    message = str(info.value)
    assert (
        str(tmp_path / 'cut.pth') in message and 'truncated' in message and '\n' not in message
    ), message


def test_a_checkpoint_without_a_digest_is_checked_by_its_crcs(saved, tmp_path):
    "Version 2 files written before the digest: the archive's CRCs catch a flipped bit in a weight."
    path, raw = saved
    # the same archive, its comment (75 bytes and their length) taken off
    old = raw[: -75 - 2] + b'\x00\x00'
    (tmp_path / 'old.pth').write_bytes(old)
    make_learner(fp16=True).load(tmp_path / 'old.pth')
    with zipfile.ZipFile(tmp_path / 'old.pth') as z:
        info = z.getinfo(
            next(n for n in z.namelist() if '/data/' in n and z.getinfo(n).file_size > 64)
        )
    name_len, extra_len = (
        int.from_bytes(old[info.header_offset + i : info.header_offset + i + 2], 'little')
        for i in (26, 28)
    )
    # the member's data: after its local header (padded by torch)
    offset = info.header_offset + 30 + name_len + extra_len
    bad = bytearray(old)
    bad[offset + 5] ^= 1
    (tmp_path / 'old.pth').write_bytes(bad)
    with pytest.raises(ValueError, match='fails its CRC check'):
        make_learner(fp16=True).load(tmp_path / 'old.pth')


def rewrite(path: Path, dest: Path, change) -> Path:
    """The checkpoint at `path`, changed by `change(state)`, written to `dest` (with torch.save: no
    digest, CRCs only)."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, dest)
    return dest


def drop_a_group(state):
    state['opt']['param_groups'].append({**state['opt']['param_groups'][0], 'params': []})


MISFITS = {  # piece: (how the checkpoint is changed, what the error says)
    'model shape': (
        lambda s: s['model'].__setitem__('0.weight', torch.zeros(3, 3)),
        "its model state does not fit this learner: 0.weight is (3, 3) in the checkpoint, (16, 20) "
        "in the model",
    ),
    'model keys': (
        lambda s: s['model'].pop('3.bias'),
        "the model has ['3.bias'] that the checkpoint lacks",
    ),
    'optimizer class': (
        lambda s: s.__setitem__('opt_class', 'torch.optim.sgd.SGD'),
        "it comes from the optimizer torch.optim.sgd.SGD, and this learner's is exp.optimizers.SGD",
    ),
    'param groups': (drop_a_group, '2 parameter groups in the checkpoint, 1 in the optimizer'),
    'buffer shape': (
        lambda s: s['opt']['state'][0].__setitem__('momentum_buffer', torch.zeros(2)),
        'momentum_buffer of parameter 0 is (2,), the parameter (16, 20)',
    ),
    'rng': (
        lambda s: s['rng'].__setitem__('torch', torch.zeros(3, dtype=torch.uint8)),
        'its rng state does not fit',
    ),
    'python rng': (
        lambda s: s['rng'].__setitem__('python', (3, (1, 2), None)),
        'its rng state does not fit',
    ),
    'sampler': (
        lambda s: s['data'].__setitem__('samplers', [torch.zeros(3, dtype=torch.uint8), None]),
        "a sampler's state does not fit its generator",
    ),
    'scaler': (
        lambda s: s['callbacks']['mixed_precision'].__setitem__('loss_scale', -1.0),
        "a MixedPrecision state holds 'loss_scale'",
    ),
}


@pytest.mark.parametrize('piece', MISFITS)
def test_a_checkpoint_that_does_not_fit_leaves_the_learner_exactly_as_it_was(
    saved, tmp_path, piece
):
    change, message = MISFITS[piece]
    bad = rewrite(saved[0], tmp_path / 'misfit.pth', change)
    learn = make_learner(seed=3, fp16=True)
    # a learner with a state of its own: momentum, a loss scale, moved RNGs and samplers
    learn.fit(1)
    before = everything(learn)
    with pytest.raises(CheckpointMismatch) as info:
        learn.load(bad)
    assert message in str(info.value) and str(bad) in str(info.value), str(info.value)
    assert same(everything(learn), before)
    learn.load(saved[0])  # and a checkpoint that fits still loads into it
    assert not same(everything(learn), before)


def test_a_checkpoint_of_another_optimizer_class_is_refused_naming_both(saved, tmp_path):
    learn = make_learner(fp16=True)
    learn.opt = optim.Adam(learn.model.parameters(), lr=1e-3)
    with pytest.raises(
        CheckpointMismatch,
        match="comes from the optimizer exp.optimizers.SGD, and this learner's is "
        "torch.optim.adam.Adam",
    ):
        learn.load(saved[0])
    # the same algorithm, torch's class: not ours
    learn.opt = optim.SGD(learn.model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(
        CheckpointMismatch,
        match="comes from the optimizer exp.optimizers.SGD, and this learner's is "
        "torch.optim.sgd.SGD",
    ):
        learn.load(saved[0])
    from exp.minibatch import Optimizer

    learn.opt = Optimizer(learn.model.parameters(), lr=0.1)  # notebook 03's, and ours
    with pytest.raises(CheckpointMismatch, match="this learner's is exp.minibatch.Optimizer"):
        learn.load(saved[0])


def test_a_callback_state_that_does_not_fit_is_caught_before_anything_loads(saved, tmp_path):
    "A learner whose own AvgStatsCallback has other columns: nothing of the checkpoint is loaded."
    learn = make_learner(fp16=True, metrics=())
    learn.cbs.append(AvgStatsCallback([accuracy, lambda p, y: accuracy(p, y)], print_stats=False))
    bad = rewrite(saved[0], tmp_path / 'table.pth', lambda s: None)
    before = everything(learn)
    with pytest.raises(
        CheckpointMismatch,
        match="its callbacks state does not fit this learner: the checkpoint's table has the "
        "columns",
    ):
        learn.load(bad)
    assert same(everything(learn), before)


# ---------------- a loss that is not finite


class NaNLossAt(Callback):
    "The loss of training batch `at` (counted over the fit) becomes nan, or `value`."

    run_before = (TerminateOnNaNCallback,)

    def __init__(self, at, value=float('nan')):
        self.at, self.value = at, value

    def after_loss(self):
        if self.in_train and self.n_iter == self.at:
            self.run.loss = self.loss * self.value


@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_a_non_finite_loss_stops_the_fit_naming_epoch_and_batch(value):
    learn = make_learner()
    n = len(learn.data.train_dl)  # 12 batches an epoch
    with pytest.raises(
        NonFiniteError, match=f'the training loss is {value} at epoch 1, batch 3: training stopped'
    ):
        learn.fit(3, cbs=[NaNLossAt(n + 3, value)])
    # stopped before the step: the weights are finite
    assert all(p.isfinite().all() for p in learn.model.parameters())
    ft.test_eq(len(learn.run.avg_stats.history), 1)  # epoch 1 never finished


def test_the_check_stops_before_the_epoch_is_saved_and_can_be_turned_off(tmp_path):
    learn = make_learner()
    with pytest.raises(NonFiniteError):
        learn.fit(2, cbs=[SaveModelCallback(tmp_path / 'c.pth'), NaNLossAt(14)])
    # the last good epoch, not overwritten
    ft.test_eq(torch.load(tmp_path / 'c.pth', weights_only=True)['epoch'], 0)
    learn = make_learner()
    learn.terminate_on_nan = False
    learn.fit(1, cbs=[NaNLossAt(2)])  # trains on, in silence, as before
    assert not all(p.isfinite().all() for p in learn.model.parameters())


def test_the_check_stands_aside_for_the_lr_finder_and_dynamic_fp16():
    learn = make_learner()
    learn.lr_find(max_iter=20, max_lr=1e6)  # diverges to inf: the finder's own business
    learn = make_learner(fp16=True)
    learn.fit(1, cbs=[NaNLossAt(2)])  # one bad batch in fp16: a skipped step, not a stop
    ft.test_eq(learn.cbs[0].skipped, 1)


def test_off_the_cpu_the_losses_are_checked_once_per_epoch():
    """The path for a GPU (reading a loss there waits for the device): the epoch's losses, checked
    together, name the batch."""
    cb = TerminateOnNaNCallback()
    cb.active, cb.batch, cb.kept = True, 0, []
    # a loss on the meta device: not on the CPU, and any read of its value on the host raises
    cb.run = type(
        'Run', (), {'in_train': True, 'loss': torch.tensor(float('nan'), device='meta')}
    )()
    cb.after_loss()
    # kept for the epoch's check, not read
    ft.test_eq((len(cb.kept), cb.kept[0].device.type, cb.batch), (1, 'meta', 1))
    cb.run = type('Run', (), {'epoch': 4})()
    cb.kept = [torch.tensor(1.0), torch.tensor(float('inf')), torch.tensor(float('nan'))]
    with pytest.raises(NonFiniteError, match='the training loss is inf at epoch 4, batch 1'):
        cb._check_kept()


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_on_a_gpu_a_non_finite_loss_stops_before_the_epoch_is_saved(tmp_path):
    from exp.cnn import DeviceCallback

    learn = make_learner()
    learn.cbs.append(DeviceCallback('cuda'))
    with pytest.raises(NonFiniteError, match='at epoch 1, batch 2'):
        learn.fit(
            2, cbs=[SaveModelCallback(tmp_path / 'c.pth'), NaNLossAt(len(learn.data.train_dl) + 2)]
        )
    ft.test_eq(torch.load(tmp_path / 'c.pth', weights_only=True)['epoch'], 0)

"""Unit tests for exp.progress: what ProgressCallback writes outside a notebook, and that it hands
printing back."""

import itertools
import re
import types

import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn

import exp.progress
import exp.terminal
from exp.callbacks import (
    AvgStatsCallback,
    Callback,
    CancelTrainException,
    DataBunch,
    Learner,
    Runner,
    print_row,
)
from exp.data import set_seed
from exp.early_stopping import EarlyStopping
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.progress import ProgressCallback, format_row, format_stat, progress_display

HEADER = ['epoch', 'train_loss', 'train_accuracy', 'valid_loss', 'valid_accuracy', 'time']
TIME = re.compile(r'\d+\.\d\ds$')


def make_learner(n_train=16, n_valid=6, bs=4, seed=0, metrics=(accuracy,)):
    g = torch.Generator().manual_seed(seed)
    x, y = (
        torch.randn(n_train + n_valid, 5, generator=g),
        torch.randint(0, 3, (n_train + n_valid,), generator=g),
    )
    train_ds, valid_ds = Dataset(x[:n_train], y[:n_train]), Dataset(x[n_train:], y[n_train:])
    data = DataBunch(
        DataLoader(train_ds, Sampler(train_ds, bs)),
        DataLoader(valid_ds, Sampler(valid_ds, bs)),
        c=3,
    )
    set_seed(seed)
    return Learner(
        data,
        nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)),
        lr=0.1,
        metrics=list(metrics),
    )


def terminal_view(raw):
    """What a terminal shows for `raw`: each '\\r' returns to the start of the line, and later text
    overwrites."""
    screen = []
    for line in raw.split('\n'):
        shown = ''
        for part in line.split('\r'):
            shown = part + shown[len(part) :]
        screen.append(shown.rstrip())
    return screen[:-1] if screen and not screen[-1] else screen


def expected_rows(history):
    return [[format_stat(k, v) for k, v in row.items()] for row in history]


def expected_lines(history):
    return [format_row(cells, HEADER) for cells in [HEADER, *expected_rows(history)]]


def untimed(lines):
    return [TIME.sub('', l) for l in lines]


# ---------------- outside a notebook


def test_auto_in_a_captured_stdout_writes_clean_table_lines(capsys):
    run = Runner(cbs=[ProgressCallback()])
    run.fit(3, make_learner())
    out = capsys.readouterr().out
    ft.test_eq(run.progress.mode, 'text')
    assert '\r' not in out and '<' not in out and 'Epoch' not in out  # no bars, no HTML
    lines = out.splitlines()
    # printed once: AvgStatsCallback stayed quiet
    ft.test_eq(lines, expected_lines(run.avg_stats.history))
    ft.test_eq(lines[0].split(), HEADER)
    ft.test_eq([l.split()[0] for l in lines[1:]], ['0', '1', '2'])
    ft.test_eq(run.progress.table[1][3], f"{run.avg_stats.history[0]['valid_loss']:.6f}")
    ft.test_eq(run.logger, print_row)  # the runner's own logger again


def test_the_progress_bar_is_the_logger_before_the_header_whatever_the_order_given(capsys):
    # AvgStatsCallback given first
    run = Runner(cbs=[AvgStatsCallback([accuracy]), ProgressCallback('text')])
    run.fit(2, make_learner(metrics=()))
    # the header too is ours
    ft.test_eq(capsys.readouterr().out.splitlines(), expected_lines(run.avg_stats.history))


def test_console_bars_leave_only_the_table_on_a_terminal(capsys):
    run = Runner(cbs=[ProgressCallback('console')])
    run.fit(2, make_learner())
    raw = capsys.readouterr().out
    # bars were drawn
    assert '\r' in raw and 'Epoch 2/2 :' in raw and '100.00% [4/4' in raw and '100.00% [2/2' in raw
    ft.test_eq(untimed(terminal_view(raw)), untimed(expected_lines(run.avg_stats.history)))


class EveryBatch(ProgressCallback):
    "The bar updated at every batch, as fastprogress's own loops do: the reference for the redraws."

    def after_batch(self):
        if self.pbar is None:
            return
        self.n_batches += 1
        self.pbar.update(self.n_batches)


def test_console_bar_redraws_as_if_updated_at_every_batch(monkeypatch, capsys):
    """ProgressCallback calls fastprogress's update only where it redraws: the same redraws, at the
    same batches, fewer calls."""
    import fastprogress.fastprogress as fp

    update_bar, update, seen = fp.ConsoleProgressBar.update_bar, fp.ProgressBar.update, {}
    for cls in (ProgressCallback, EveryBatch):
        # 13 ms at each reading: both runs read it at the same redraws
        clock = itertools.count(0.0, 0.013)
        monkeypatch.setattr(fp, 'time', types.SimpleNamespace(time=lambda: next(clock)))
        redraws, calls = [], []
        monkeypatch.setattr(
            fp.ConsoleProgressBar,
            'update_bar',
            lambda self, val: (redraws.append((self.total, val)), update_bar(self, val))[1],
        )
        monkeypatch.setattr(
            fp.ProgressBar, 'update', lambda self, val: (calls.append(val), update(self, val))[1]
        )
        Runner(cbs=[cls('console')]).fit(2, make_learner(n_train=800, n_valid=120))
        seen[cls] = redraws, len(calls)
    (ours, n_ours), (every, n_every) = seen[ProgressCallback], seen[EveryBatch]
    ft.test_eq(ours, every)
    # skipped batches, and each bar's end drawn
    assert (200, 200) in ours and (30, 30) in ours and len(ours) < 100, ours
    assert n_ours < n_every / 4, (n_ours, n_every)
    capsys.readouterr()


def test_off_leaves_avg_stats_printing(capsys):
    run = Runner(cbs=[ProgressCallback('off')])
    run.fit(2, make_learner())
    lines = capsys.readouterr().out.splitlines()
    ft.test_eq(len(lines), 3)
    ft.test_eq(lines[0].split(), HEADER)  # AvgStatsCallback's own table
    ft.test_eq(run.progress.table, [])


def test_early_stopping_message_after_the_last_row(capsys):
    run = Runner(cbs=[ProgressCallback(), EarlyStopping('train_loss', patience=1, min_delta=10.0)])
    run.fit(10, make_learner())
    lines = capsys.readouterr().out.splitlines()
    ft.test_eq(lines[:-1], expected_lines(run.avg_stats.history))
    ft.test_eq(len(lines), 1 + 2 + 1)
    assert lines[-1].startswith('EarlyStopping: stopped after epoch 1'), lines[-1]


class StopAt(Callback):
    def __init__(self, n_iter, exc=CancelTrainException):
        self.n_iter_stop, self.exc = n_iter, exc

    def after_batch(self):
        if self.in_train and self.n_iter == self.n_iter_stop:
            raise self.exc()


class Boom(Exception):
    pass


@pytest.mark.parametrize('exc', [CancelTrainException, Boom])
@pytest.mark.parametrize('display', ['text', 'console'])
def test_cancel_or_error_mid_epoch_closes_and_hands_back(exc, display, capsys):
    # in epoch 1's training (4 batches per epoch)
    run = Runner(cbs=[ProgressCallback(display), StopAt(6, exc)])
    if exc is Boom:
        with pytest.raises(Boom):
            run.fit(3, make_learner())
    else:
        run.fit(3, make_learner())
    raw = capsys.readouterr().out
    ft.test_eq(untimed(terminal_view(raw)), untimed(expected_lines(run.avg_stats.history)))
    ft.test_eq(len(run.avg_stats.history), 1)
    assert run.logger is print_row and run.progress.mbar is None


def test_without_avg_stats_only_bars(capsys):
    run = Runner(cbs=[ProgressCallback('console')])
    run.fit(2, make_learner(metrics=()))
    raw = capsys.readouterr().out
    assert '100.00% [4/4' in raw
    ft.test_eq(terminal_view(raw), [])  # the bars blank themselves out: nothing stays
    ft.test_eq(run.progress.table, [])
    Runner(cbs=[ProgressCallback()]).fit(1, make_learner(metrics=()))
    ft.test_eq(capsys.readouterr().out, '')


def test_zero_epochs_writes_the_header(capsys):
    Runner(cbs=[ProgressCallback('console')]).fit(0, make_learner())
    ft.test_eq(terminal_view(capsys.readouterr().out), [format_row(HEADER, HEADER)])


def test_avg_stats_silenced_by_choice_stays_silent(capsys):
    # it logs nothing: no table, wherever the logger writes
    stats = AvgStatsCallback([accuracy], print_stats=False)
    run = Runner(cbs=[ProgressCallback('text'), stats])
    run.fit(1, make_learner())
    ft.test_eq(capsys.readouterr().out, '')
    ft.test_eq((len(stats.history), run.progress.table), (1, []))


# ---------------- in an IPython shell, notebook bars


@pytest.fixture
def ipython_shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def test_notebook_bars_build_the_html_table(ipython_shell):
    from IPython.utils.capture import capture_output

    run = Runner(cbs=[ProgressCallback('notebook')])
    # what the notebook would display, in order
    with capture_output() as shown:
        run.fit(2, make_learner())
    final = shown.outputs[-1].data['text/html']  # the last view: the table, the bars gone
    assert '<progress' in shown.outputs[1].data['text/html'] and '<progress' not in final
    ft.test_eq(re.findall(r'<th>(.*?)</th>', final), HEADER)
    rows = [
        re.findall(r'<td>(.*?)</td>', row) for row in re.findall(r'<tr>(.*?)</tr>', final, re.S)
    ]
    # a row per epoch, as the history holds it
    ft.test_eq(rows, expected_rows(run.avg_stats.history))
    cb = run.progress
    ft.test_eq(cb.table[0], HEADER)
    ft.test_eq(len(cb.table), 3)
    assert run.logger is print_row


# ---------------- formatting and checks


def test_format_stat_and_row():
    ft.test_eq(
        [format_stat('epoch', 2.0), format_stat('valid_loss', 0.25), format_stat('time', 0.0549)],
        ['2', '0.250000', '0.05s'],
    )
    ft.test_eq(format_stat('time', 3725.0), '1:02:05')
    ft.test_eq(
        format_row(['1', '0.5'], ['epoch', 'a_long_column_name']), '         1                 0.5'
    )


def test_what_moved_to_exp_terminal_still_imports_from_here():
    "The display's choice moved to exp.terminal (appendix A5); exp.progress re-exports it."
    for name in ['DISPLAYS', 'in_jupyter', 'progress_display']:
        assert name in exp.progress.__all__, name
        assert getattr(exp.progress, name) is getattr(exp.terminal, name), name


def test_checks():
    with pytest.raises(
        ValueError, match="display must be one of auto, notebook, console, text, off; got 'html'"
    ):
        ProgressCallback('html')
    with pytest.raises(ValueError, match="got 'tty'"):
        progress_display('tty')

"""exp.runs: the run folder's end (finished or kept), what a resumed run may not change, signals and
the one line after a failure. The claims, check_out and find_run are tried through the trainer in
test_train.py."""

import os
import signal
import time
from types import SimpleNamespace

import pytest
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test

from exp.runs import (
    CHECKPOINT,
    TRACEBACK,
    Stopped,
    check_unchanged,
    claim_run_folder,
    exit_code,
    failure_line,
    finish_run,
    keep_run,
    spelt,
    stop_on_signals,
)


def test_keep_run_keeps_a_folder_with_a_checkpoint_and_removes_one_without(tmp_path):
    _, empty, claim = claim_run_folder(tmp_path / 'empty')
    ft.test_eq((keep_run(empty, claim, RuntimeError('boom')), empty.exists()), (None, False))
    _, folder, claim = claim_run_folder(tmp_path / 'run')
    (folder / CHECKPOINT).write_bytes(b'weights')
    ft.test_eq(keep_run(folder, claim, RuntimeError('boom')), folder)
    assert 'RuntimeError: boom' in (folder / TRACEBACK).read_text()
    # a stop the user asked for leaves no traceback
    _, stopped, claim = claim_run_folder(tmp_path / 'stopped')
    (stopped / CHECKPOINT).write_bytes(b'weights')
    ft.test_eq(keep_run(stopped, claim, KeyboardInterrupt()), stopped)
    ft.test_eq(sorted(p.name for p in stopped.iterdir()), ['.claim', CHECKPOINT])


def test_finish_run_writes_the_files_and_renames_the_folder(tmp_path):
    out, folder, claim = claim_run_folder(tmp_path / 'run')
    recorder = SimpleNamespace(
        plot_loss=lambda ax: ax.plot([1, 0]), plot_lr=lambda ax: ax.plot([1])
    )
    finish_run(folder, out, claim, [{'epoch': 0, 'valid_loss': 0.5}], recorder)
    ft.test_eq(sorted(p.name for p in out.iterdir()), ['loss.png', 'lr.png', 'metrics.csv'])
    ft.test_eq((out / 'metrics.csv').read_text().splitlines(), ['epoch,valid_loss', '0,0.5'])
    assert not folder.exists()


def test_check_unchanged_lists_every_change_and_allows_the_runs_own_values(tmp_path):
    folder = tmp_path / 'run.partial'
    run = SimpleNamespace(epochs=30, one_cycle=True, lr=0.1)
    asked = SimpleNamespace(epochs=12, one_cycle=False, lr=0.1)
    given = {'epochs': 12, 'one_cycle': False, 'lr': 0.1, 'out': str(tmp_path / 'other')}
    with pytest.raises(ValueError) as info:
        check_unchanged(folder, run, asked, given, ('epochs', 'one_cycle', 'lr'))
    ft.test_eq(
        str(info.value).split('these would change it: ')[1],
        "--epochs 12 (the run's: --epochs 30); --no-one-cycle (the run's: --one-cycle); "
        f"--out {tmp_path / 'other'} (the run's: {tmp_path / 'run'})",
    )
    check_unchanged(folder, run, run, {'epochs': 30, 'out': str(tmp_path / 'run')}, ('epochs',))
    # compared as the key says: 'auto' is the run's 'off' on this machine
    key = lambda name, value: 'off' if value == 'auto' else value
    fp16 = SimpleNamespace(fp16='off'), SimpleNamespace(fp16='auto')
    check_unchanged(folder, *fp16, {'fp16': 'auto'}, ('fp16',), key)
    ft.test_eq((spelt('lr_find', True), spelt('bs', 64)), ('--lr-find', '--bs 64'))


def test_a_signal_in_stop_on_signals_is_stopped_once_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals():
        with pytest.raises(Stopped) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives while the program waits here
        ft.test_eq(signal.getsignal(signal.SIGTERM), signal.SIG_IGN)  # one stop is enough
    ft.test_eq(signal.getsignal(signal.SIGTERM), before)
    ft.test_eq((info.value.signame, exit_code(info.value)), ('SIGTERM', 143))
    ft.test_eq((exit_code(KeyboardInterrupt()), exit_code(ValueError())), (130, 1))


def test_failure_line_says_what_was_kept_and_how_to_continue(tmp_path, monkeypatch):
    monkeypatch.setattr('sys.argv', ['exp.train'])
    for k in ('TORCHELASTIC_RUN_ID', 'TORCHELASTIC_MAX_RESTARTS', 'TORCHELASTIC_RESTART_COUNT'):
        monkeypatch.delenv(k, raising=False)
    ft.test_eq(
        failure_line(OSError(28, 'No space left on device'), 'during epoch 0', None, None),
        'No space left on device, during epoch 0, before any checkpoint: nothing was kept; run '
        'the same command again',
    )
    line = failure_line(Stopped(signal.SIGHUP), 'during epoch 3', tmp_path, 2)
    assert line.startswith(f'stopped by SIGHUP, during epoch 3; the run so far is in {tmp_path}')
    assert (
        line.endswith(f'-m exp.train --resume {tmp_path}') and '(its checkpoint: epoch 2)' in line
    )

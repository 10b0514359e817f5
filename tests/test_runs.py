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
    RunClaim,
    RunFolderError,
    Stopped,
    check_identity,
    check_out,
    check_unchanged,
    claim_run_folder,
    find_run,
    reclaim_run_folder,
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
    before, ctrl_c = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stop_on_signals():
        with pytest.raises(Stopped) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives while the program waits here
        ft.test_eq(signal.getsignal(signal.SIGTERM), signal.SIG_IGN)  # one stop is enough
    ft.test_eq(signal.getsignal(signal.SIGTERM), before)
    ft.test_eq((info.value.signame, exit_code(info.value)), ('SIGTERM', 143))
    ft.test_eq(signal.getsignal(signal.SIGINT), ctrl_c)
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


def test_once_stopping_a_ctrl_c_is_held_too_until_stop_on_signals_ends():
    "SIGTERM, then a Ctrl-C while the trainer stops: ignored, so the report stays the SIGTERM's."
    ctrl_c, term, hup = (
        signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    )
    with stop_on_signals():
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        ft.test_eq(signal.getsignal(signal.SIGINT), signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        time.sleep(0.05)
    ft.test_eq(signal.getsignal(signal.SIGINT), ctrl_c)
    # a program that exits after the stop keeps them ignored through its exit handlers
    try:
        with pytest.raises(SystemExit):
            with stop_on_signals():
                with pytest.raises(Stopped):
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)
                raise SystemExit(143)
        ft.test_eq(signal.getsignal(signal.SIGINT), signal.SIG_IGN)
    finally:
        for s, handler in ((signal.SIGINT, ctrl_c), (signal.SIGTERM, term), (signal.SIGHUP, hup)):
            signal.signal(s, handler)


def test_the_run_files_replace_links_and_never_write_through_them(tmp_path):
    out, folder, claim = claim_run_folder(tmp_path / 'run')
    outside = tmp_path / 'outside'
    outside.mkdir()
    for name in ('metrics.csv', 'loss.png', 'lr.png'):
        (outside / name).write_text('precious')
        (folder / name).symlink_to(outside / name)
    recorder = SimpleNamespace(
        plot_loss=lambda ax: ax.plot([1, 0]), plot_lr=lambda ax: ax.plot([1])
    )
    finish_run(folder, out, claim, [{'epoch': 0, 'valid_loss': 0.5}], recorder)
    ft.test_eq(
        [(outside / n).read_text() for n in sorted(p.name for p in outside.iterdir())],
        ['precious'] * 3,
    )
    assert not any(p.is_symlink() for p in out.iterdir())
    ft.test_eq((out / 'metrics.csv').read_bytes(), b'epoch,valid_loss\r\n0,0.5\r\n')
    # the traceback of a kept run, and the claim itself
    _, kept, claim = claim_run_folder(tmp_path / 'kept')
    (kept / CHECKPOINT).write_bytes(b'weights')
    (outside / TRACEBACK).write_text('precious')
    (kept / TRACEBACK).symlink_to(outside / TRACEBACK)
    keep_run(kept, claim, RuntimeError('boom'))
    assert 'boom' in (kept / TRACEBACK).read_text() and not (kept / TRACEBACK).is_symlink()
    (outside / '.claim').write_text('precious')
    (kept / RunClaim.FILE).unlink()
    (kept / RunClaim.FILE).symlink_to(outside / '.claim')
    ft.test_eq(RunClaim.holder(kept), None)  # a link is no claim
    claim = RunClaim.take(kept)
    claim.release()
    ft.test_eq(
        ((outside / TRACEBACK).read_text(), (outside / '.claim').read_text()),
        (
            'precious',
            'precious',
        ),
    )
    assert not (kept / RunClaim.FILE).is_symlink()


def test_a_full_disk_at_the_claim_leaves_nothing_behind(tmp_path, monkeypatch):
    write = os.write

    def full(fd, data):
        if os.readlink(f'/proc/self/fd/{fd}').endswith(RunClaim.FILE):
            raise OSError(28, os.strerror(28))
        return write(fd, data)

    if not os.path.isdir('/proc/self/fd'):
        pytest.skip('needs /proc (Linux)')
    with monkeypatch.context() as m:
        m.setattr(os, 'write', full)
        with pytest.raises(RunFolderError, match='No space left on device'):
            claim_run_folder(tmp_path / 'run')
    ft.test_eq(list(tmp_path.iterdir()), [])
    out, folder, claim = claim_run_folder(tmp_path / 'run')  # once there is room: claimed
    claim.release()
    # resuming: the folder holds a run, so it stays, unclaimed
    with monkeypatch.context() as m:
        m.setattr(os, 'write', full)
        with pytest.raises(RunFolderError, match='nothing was written; run the same command'):
            reclaim_run_folder(folder)
    ft.test_eq(RunClaim.holder(folder), None)
    reclaim_run_folder(folder).release()


def test_an_empty_out_that_cannot_be_removed_is_refused_before_anything(tmp_path, monkeypatch):
    (tmp_path / 'volume').mkdir()
    rmdir = os.rmdir

    def busy(path, *args, **kwargs):
        if os.path.basename(path) == 'volume':
            raise OSError(16, os.strerror(16), str(path))
        return rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, 'rmdir', busy)
    with pytest.raises(RunFolderError, match='cannot replace .Device or resource busy: a mount'):
        claim_run_folder(tmp_path / 'volume')
    ft.test_eq(sorted(p.name for p in tmp_path.iterdir()), ['volume'])


def test_out_and_resume_names_that_mislead(tmp_path):
    with pytest.raises(ValueError, match='a name ending in .partial is an unfinished run'):
        check_out(tmp_path / 'x.partial')
    with pytest.raises(ValueError, match='--resume /: not a run folder of exp.train'):
        find_run('/')


def test_check_identity(tmp_path):
    path = tmp_path / CHECKPOINT
    ours = {'options': {'bs': 32, 'lr': 0.1, 'out': 'run'}, 'data': 'abc'}
    ft.test_eq(check_identity(path, ours, ours), None)
    assert 'cannot be checked' in check_identity(path, None, ours)
    theirs = {'options': {'bs': 64, 'lr': 0.1, 'out': 'other'}, 'data': 'abc'}
    with pytest.raises(ValueError) as info:
        check_identity(path, theirs, ours)
    ft.test_eq(
        str(info.value),
        f"--resume {path}: that checkpoint belongs to another run: --bs 64 (this run's: --bs 32); "
        "--out other (this run's: --out run)",
    )
    with pytest.raises(ValueError, match='the files of --data .* changed since the run started'):
        check_identity(path, {**ours, 'data': 'def'}, ours)


def test_resuming_when_the_runs_name_was_taken_meanwhile_is_refused_at_once(tmp_path):
    out, folder, claim = claim_run_folder(tmp_path / 'run')
    claim.release()
    out.mkdir()
    (out / 'stranger.txt').write_text('made while the run was stopped')
    with pytest.raises(RunFolderError, match='run exists and is not empty, so the finished run'):
        reclaim_run_folder(folder)
    ft.test_eq(RunClaim.holder(folder), None)

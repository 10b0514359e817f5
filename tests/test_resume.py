"""Tests for exp.options and exp.resume (appendix A3c and A3d): the trainer's options and its
resume, out of exp.train, which re-exports them; and exp.train kept short enough to read."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastcore import test as ft

import exp.options
import exp.resume
import exp.train
from exp.options import TrainConfig, check_data, given_options
from exp.resume import (
    RUN_OPTIONS,
    failure_report,
    read_run_config,
    resolve_run,
    resume_point,
    run_identity,
    write_run_config,
)

ROOT = Path(__file__).resolve().parents[1]


def test_exp_train_reexports_the_same_objects():
    for module in (exp.options, exp.resume):
        for name in set(module.__all__) & set(exp.train.__all__):
            assert getattr(exp.train, name) is getattr(module, name), name
    for name in ('TrainConfig', 'check_config', 'make_parser', 'resolve_fp16', 'read_run_config'):
        assert name in exp.train.__all__, name
    for name in ('data_fingerprint', 'run_identity', 'resumed_config', 'RUN_OPTIONS', 'MAX_LR'):
        assert name in exp.train.__all__, name


@pytest.mark.parametrize('module', ['exp.options', 'exp.resume'])
def test_the_appendix_modules_do_not_import_the_trainer(module):
    code = f"import sys, {module}; print('exp.train' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    ft.test_eq((proc.returncode, proc.stdout.strip()), (0, 'False'))


def test_exp_train_stays_short():
    "The trainer reads top to bottom: options, data and model, fit, the run folder written."
    assert len((ROOT / 'exp' / 'train.py').read_text().splitlines()) < 300


def test_given_options_copies_and_checks_the_paths_it_looks_at_first():
    kwargs = {'resume': Path('runs') / 'a', 'out': 3}
    ft.test_eq(given_options(None, kwargs), {'resume': 'runs/a', 'out': 3})  # out: the run's
    ft.test_eq(kwargs['resume'], Path('runs') / 'a')  # the caller's dict is left alone
    ft.test_fail(lambda: given_options(None, {'out': 3}), contains='--out must be a path, got 3')
    ft.test_fail(lambda: given_options(None, {'resume': ''}), contains='--resume must be a path')
    ft.test_eq(given_options(TrainConfig(epochs=3, seed=42), {}), {'epochs': 3})
    ft.test_fail(lambda: given_options(TrainConfig(), {'epochs': 3}), contains='not both')
    ft.test_fail(lambda: given_options({'epochs': 3}, {}), contains='cfg must be a TrainConfig')


def test_check_data_counts_the_classes_and_refuses_a_stray_label():
    import torch

    x, y = torch.rand(4, 2, 2), torch.tensor([0, 1, 0, 1])
    ft.test_eq(check_data('toy', x, y, x, y), 2)
    ft.test_fail(
        lambda: check_data('toy', x, torch.tensor([0, 1, 0, 9]), x, y),
        contains='--data toy: the train labels run to 9, but 7 class(es) below it never appear',
    )


@pytest.fixture
def run(tmp_path):
    "A run's partial folder with its config.json, as the trainer writes it before its first epoch."
    cfg = TrainConfig(arch='mlp', epochs=2, out=str(tmp_path / 'run')).check()
    folder = tmp_path / 'run.partial'
    folder.mkdir()
    return write_run_config(cfg, folder, tmp_path / 'run', lr=0.03), folder


def test_resolve_run_new_resumed_and_restarted(run, tmp_path, monkeypatch):
    config, folder = run
    ft.test_eq(read_run_config(folder), config)
    cfg, found, out = resolve_run(None, {'resume': str(folder)})
    ft.test_eq((cfg.epochs, cfg.lr, found, out), (2, 0.03, folder, tmp_path / 'run'))
    cfg, found, out = resolve_run(TrainConfig(out=str(tmp_path / 'new')), {})
    ft.test_eq((found, out), (None, tmp_path / 'new'))
    # torchrun restarted the workers: the run they were writing goes on, with no --resume
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    ft.test_eq(resolve_run(None, {'out': str(tmp_path / 'run')})[1], folder)
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '0')
    monkeypatch.setenv('WORLD_SIZE', '2')
    ft.test_fail(lambda: resolve_run(None, {'lr_find': True}), contains='--lr-find runs in one')


def test_resume_point_without_a_checkpoint_starts_at_0(run):
    config, folder = run
    learn = SimpleNamespace()
    ft.test_eq(resume_point(learn, config, None, None), (None, 0))
    ft.test_eq(resume_point(learn, config, folder, None), (None, 0))
    ft.test_eq(learn.run_identity, run_identity(config, None))  # what the first save records
    ft.test_eq(set(learn.run_identity['options']), {*RUN_OPTIONS, 'out'})


def test_failure_report_says_where():
    learn = SimpleNamespace(run=SimpleNamespace(epoch=3))
    line = failure_report(KeyboardInterrupt(), 'training', learn, None, None)
    ft.test_eq(line.startswith('interrupted (Ctrl-C), during epoch 3, before any checkpoint'), True)
    line = failure_report(ValueError('x'), 'training', SimpleNamespace(run=None), None, None)
    ft.test_eq('as training began' in line, True)
    line = failure_report(
        OSError(28, 'No space left on device'), 'writing the run folder', learn, None, None
    )
    ft.test_eq(line.startswith('No space left on device, writing the run folder'), True)

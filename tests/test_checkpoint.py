"""Unit tests for exp.checkpoint, the checkpoint format on its own: it works without exp.learner
(which imports it, never the other way round), and exp.learner re-exports its names. The Learner's
save, load and resume are tested through the Learner in tests/test_learner.py."""

import subprocess
import sys
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn

import exp.checkpoint as ckpt
from exp.callbacks import DataBunch, Learner, Runner
from exp.data import set_seed
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / 'fixtures'


def make_learner(seed=0):
    "A small MLP on Gaussian blobs, 3 classes, with our SGD with momentum."
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)
    train_ds, valid_ds = Dataset(x[:48], y[:48]), Dataset(x[48:], y[48:])
    data = DataBunch(
        DataLoader(train_ds, Sampler(train_ds, 16, shuffle=True)),
        DataLoader(valid_ds, Sampler(valid_ds, 16)),
        c=3,
    )
    set_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return Learner(data, model, lr=0.1, opt_func=partial(SGD, momentum=0.9))


def test_the_module_imports_alone_and_not_the_learner():
    code = "import sys, exp.checkpoint; print('exp.learner' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    ft.test_eq(proc.stdout.strip(), 'False')


def test_exp_learner_re_exports_the_same_objects():
    import exp.learner

    for name in ('CHECKPOINT_VERSION', 'CheckpointMismatch', 'SaveModelCallback'):
        assert getattr(exp.learner, name) is getattr(ckpt, name), name
        assert name in exp.learner.__all__, name
    assert exp.learner.TerminateOnNaNCallback is ckpt.TerminateOnNaNCallback
    assert 'TerminateOnNaNCallback' in exp.learner.__all__


def test_write_then_read_carries_a_digest(tmp_path):
    learn = make_learner()
    state = ckpt.checkpoint_state(learn)
    ft.test_eq(state['version'], ckpt.CHECKPOINT_VERSION)
    ft.test_eq(state['epoch'], None)  # not saved during a fit
    ft.test_eq(state['opt_class'], 'exp.optimizers.SGD')
    path = ckpt.write_checkpoint(state, tmp_path / 'a.pth')
    ft.test_eq(path, tmp_path / 'a.pth')
    raw = path.read_bytes()
    assert raw[-75:-64] == b'exp-sha256:'  # the zip comment: the tag, then the hex digest
    back = ckpt.read_checkpoint(str(path))
    for k, v in learn.model.state_dict().items():
        ft.test_eq(back['model'][k], v)
    # torch.load reads it as an ordinary checkpoint
    ft.test_eq(torch.load(path, weights_only=True)['version'], ckpt.CHECKPOINT_VERSION)


def test_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match='state must be a dict, got list'):
        ckpt.write_checkpoint([1], tmp_path / 'a.pth')
    with pytest.raises(TypeError, match='learn must be a Learner, got str'):
        ckpt.checkpoint_state('learner')
    with pytest.raises(TypeError, match='learn must be a Learner, got int'):
        ckpt.load_checkpoint(3, tmp_path / 'a.pth')
    with pytest.raises(FileNotFoundError, match='no checkpoint at'):
        ckpt.read_checkpoint(tmp_path / 'missing.pth')


def test_a_version_1_checkpoint_reads_as_version_2():
    state = ckpt.read_checkpoint(FIXTURES / 'checkpoint_v1.pth')
    ft.test_eq((state['version'], state['epoch']), (2, 0))
    ft.test_eq(sorted(state['callbacks']), ['avg_stats', 'mixed_precision', 'recorder'])
    assert 'samplers' in state['data']


def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path):
    path = ckpt.write_checkpoint(ckpt.checkpoint_state(make_learner()), tmp_path / 'a.pth')
    other = make_learner(seed=1)
    other.model[2] = nn.Linear(8, 4)
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(ckpt.CheckpointMismatch, match='its model state does not fit') as e:
        ckpt.load_checkpoint(other, path)
    ft.test_eq(e.value.piece, 'model')
    for k, v in other.model.state_dict().items():
        ft.test_eq(v, before[k])


def test_save_model_callback_works_without_the_learner_module(tmp_path):
    "A Runner's fit with SaveModelCallback writes through exp.checkpoint alone; rank 1 writes none."
    learn = make_learner()
    Runner(cbs=[ckpt.SaveModelCallback(tmp_path / 'a.pth')]).fit(2, learn)
    state = ckpt.read_checkpoint(tmp_path / 'a.pth')
    ft.test_eq((state['epoch'], state['epochs']), (1, 2))
    other = make_learner(seed=1)
    ckpt.load_checkpoint(other, tmp_path / 'a.pth')
    for p, q in zip(learn.model.parameters(), other.model.parameters()):
        ft.test_eq(p.detach(), q.detach())
    learn.rank = 1
    ft.test_eq(ckpt.save_checkpoint(learn, tmp_path / 'b.pth'), tmp_path / 'b.pth')
    assert not (tmp_path / 'b.pth').exists()


def test_interrupt_note_names_the_last_checkpoint(tmp_path):
    learn = make_learner()
    run = Runner(cbs=[ckpt.SaveModelCallback(tmp_path / 'a.pth')])
    run.fit(1, learn)
    ft.test_eq(
        ckpt.interrupt_note(run),
        f"Interrupted during epoch 0: the model is usable (fp32, callbacks done); the last "
        f"checkpoint is {tmp_path / 'a.pth'}.",
    )
    bare = Runner(cbs=[])
    bare.fit(1, make_learner())
    assert ckpt.interrupt_note(bare).endswith('no checkpoint was written.')


def fitted_state(tmp_path):
    "The checkpoint of a 1-epoch fit with a table (accuracy) and a Recorder: (state, learner)."
    from exp.anneal import Recorder
    from exp.loss import accuracy

    learn = make_learner()
    learn.metrics = [accuracy]
    run = Runner(cbs=[Recorder(), ckpt.SaveModelCallback(tmp_path / 'fit.pth')])
    run.fit(1, learn)
    return ckpt.read_checkpoint(tmp_path / 'fit.pth'), learn


def set_lr(state, v):
    state['opt']['param_groups'][0]['lr'] = v


def set_momentum(state, v):
    state['opt']['param_groups'][0]['momentum'] = v


def nan_weight(state):
    state['model']['0.weight'][0, 0] = float('nan')


def scalar_buffer(state):
    state['opt']['state'][0]['momentum_buffer'] = torch.tensor(0.5)


def string_in_table(state):
    state['callbacks']['avg_stats']['history'][0]['valid_loss'] = 'low'


def bad_recorder(state):
    state['callbacks']['recorder'] = {'lrs': [torch.zeros(3)], 'losses': torch.zeros(2)}


BAD_VALUES = {
    'epoch -5': (lambda s: s.update(epoch=-5), "its epoch is -5"),
    "epoch '1'": (lambda s: s.update(epoch='1'), "its epoch is '1'"),
    'lr nan': (lambda s: set_lr(s, float('nan')), 'lr must be >= 0 and finite, got nan'),
    "lr 'fast'": (lambda s: set_lr(s, 'fast'), "lr must be a real number, got 'fast'"),
    'momentum 5': (lambda s: set_momentum(s, 5), 'momentum must be in [0, 1), got 5'),
    'nan weights': (nan_weight, 'its weight 0.weight holds nan or inf'),
    '0-d momentum buffer': (scalar_buffer, 'momentum_buffer of parameter 0 is (), the parameter'),
    'a string in the table': (string_in_table, "its avg_stats table holds 'low'"),
    'a bad Recorder state': (bad_recorder, 'a Recorder state holds'),
}


@pytest.mark.parametrize('case', BAD_VALUES)
def test_values_a_fit_cannot_use_are_refused_and_change_nothing(tmp_path, case):
    "A signed checkpoint holding values a fit cannot train on: refused in one line, nothing loaded."
    state, _ = fitted_state(tmp_path)
    spoil, message = BAD_VALUES[case]
    spoil(state)
    path = ckpt.write_checkpoint(state, tmp_path / 'bad.pth')  # its digest is right
    other = make_learner(seed=1)
    from exp.loss import accuracy

    other.metrics = [accuracy]
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(ValueError) as e:
        ckpt.load_checkpoint(other, path)
    assert message in str(e.value) and '\n' not in str(e.value), str(e.value)
    for k, v in other.model.state_dict().items():
        ft.test_eq(v, before[k])
    ft.test_eq(other.opt.state_dict()['state'], {})


def test_the_learners_fit_resume_refused_leaves_the_learner_as_it_was(tmp_path):
    "fit(resume=) of a checkpoint whose Recorder state is bad: refused before any weight changes."
    import exp.learner  # noqa: F401 (adds Learner.fit, with resume)

    state, _ = fitted_state(tmp_path)
    bad_recorder(state)
    path = ckpt.write_checkpoint(state, tmp_path / 'bad.pth')
    other = make_learner(seed=1)
    other.display = 'off'
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(ValueError, match='a Recorder state holds'):
        other.fit(2, resume=path)
    for k, v in other.model.state_dict().items():
        ft.test_eq(v, before[k])


def test_a_good_fitted_checkpoint_still_loads(tmp_path):
    state, learn = fitted_state(tmp_path)
    other = make_learner(seed=1)
    ckpt.load_checkpoint(other, tmp_path / 'fit.pth')
    for p, q in zip(learn.model.parameters(), other.model.parameters()):
        ft.test_eq(p.detach(), q.detach())


def test_a_valid_digest_over_an_archive_torch_refuses_is_one_line(tmp_path):
    "An extra member in the zip, the digest recomputed: torch.load's refusal, in one line."
    import io
    import zipfile

    buffer = io.BytesIO()
    torch.save(ckpt.checkpoint_state(make_learner()), buffer)
    with zipfile.ZipFile(buffer, 'a') as z:
        z.writestr('extra/stray.txt', 'not torch')
    path = tmp_path / 'extra.pth'
    path.write_bytes(ckpt._with_digest(buffer.getvalue()))
    with pytest.raises(ValueError, match=r'extra\.pth cannot be read as a checkpoint \(torch') as e:
        ckpt.read_checkpoint(path)
    assert '\n' not in str(e.value)
    with pytest.raises(ValueError, match='cannot be read as a checkpoint'):
        ckpt.load_checkpoint(make_learner(), path)


@pytest.mark.parametrize('path', ['', '.'])
def test_saving_to_no_file_is_refused_in_one_line(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"path must be a file's path, got '{path}'"):
        ckpt.save_checkpoint(make_learner(), path)
    with pytest.raises(ValueError, match="path must be a file's path, got ''"):
        ckpt.write_checkpoint({}, '')
    ft.test_eq(list(tmp_path.iterdir()), [])


def test_an_fp16_learner_loading_an_fp32_checkpoint_says_so(tmp_path):
    from exp.fp16 import to_fp16

    path = ckpt.write_checkpoint(ckpt.checkpoint_state(make_learner()), tmp_path / 'fp32.pth')
    learn = to_fp16(make_learner(seed=1))
    with pytest.warns(UserWarning, match='saved by a learner that trains in fp32') as w:
        ckpt.load_checkpoint(learn, path)
    ft.test_eq(len(w), 1)
    # an fp16 checkpoint into an fp16 learner: no word
    path16 = ckpt.write_checkpoint(ckpt.checkpoint_state(learn), tmp_path / 'fp16.pth')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ckpt.load_checkpoint(to_fp16(make_learner(seed=2)), path16)

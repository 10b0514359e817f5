"""The trainer's recipes (exp.recipes, notebook A13): option checks, and what is built from them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test

from exp.augment import BatchTransform, LabelSmoothingCrossEntropy, MixUp, random_flip
from exp.callbacks import Callback, DataBunch
from exp.data import IDX_FILES, get_data, write_idx
from exp.learner import Learner  # with notebook 10's fit
from exp.minibatch import Dataset, get_dls
from exp.optimizers import SGD, AdamW
from exp.recipes import AUGMENTS, OPTIMIZERS, RECIPES, check_aug, check_label_smoothing
from exp.recipes import check_mixup, check_opt, check_threads, check_wd, loss_func, opt_func
from exp.recipes import ChannelsLast, resnet_for, set_threads, to_channels_last, train_callbacks
from exp.train import CHECKPOINT, Trainer


def test_every_architecture_has_a_recipe_of_known_choices():
    ft.test_eq(sorted(RECIPES), ['cnn', 'mlp', 'resnet', 'simple_cnn'])
    for recipe in RECIPES.values():
        assert recipe.opt in OPTIMIZERS and check_wd(recipe.wd) == recipe.wd
        assert recipe.bs >= 1 and recipe.lr > 0 and check_threads(recipe.threads) == recipe.threads
    # the lesson models keep the trainer's defaults of before; the ResNet trains course22p2's way
    ft.test_eq([RECIPES[a].bs for a in ('mlp', 'cnn', 'simple_cnn')], [32, 32, 32])
    ft.test_eq((RECIPES['resnet'].opt, RECIPES['resnet'].bs), ('adamw', 256))


def test_aug_is_normalised_to_the_order_of_application():
    ft.test_eq(AUGMENTS, ('crop', 'flip', 'erase'))
    ft.test_eq(check_aug('none'), 'none')
    ft.test_eq(check_aug('erase,flip,crop'), 'crop,flip,erase')
    ft.test_eq(check_aug('flip'), 'flip')


@pytest.mark.parametrize(
    'check, value, message',
    [
        (check_aug, 'flip,flip', "--aug must be none or some of crop, flip, erase"),
        (check_aug, 'rotate', "got 'rotate'"),
        (check_aug, '', "got ''"),
        (check_aug, 'none,flip', "got 'none,flip'"),
        (check_aug, None, 'got None'),
        (check_opt, 'adam', '--opt must be one of sgd, adamw'),
        (check_wd, -0.01, '--wd must be a number from 0 to below 1, got -0.01'),
        (check_wd, float('nan'), '--wd must be'),
        (check_wd, True, '--wd must be'),
        (check_mixup, -1, '--mixup must be a number from 0'),
        (check_mixup, float('inf'), '--mixup must be'),
        (check_label_smoothing, 1.0, '--label-smoothing must be a number from 0 to below 1'),
        (check_label_smoothing, '0.1', '--label-smoothing must be'),
        (check_threads, 0, '--threads must be a whole number from 1 to 1024, got 0'),
        (check_threads, 2.0, '--threads must be'),
    ],
)
def test_bad_values_are_refused_in_one_line(check, value, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        check(value)


def test_optimizers():
    sgd, adamw = opt_func('sgd', 0.0), opt_func('adamw', 0.05)
    # without weight decay, exactly the optimizer the trainer always built
    assert sgd.func is SGD and sgd.keywords == {'momentum': 0.9}
    ft.test_eq(opt_func('sgd', 0.1).keywords, {'momentum': 0.9, 'weight_decay': 0.1})
    assert adamw.func is AdamW and adamw.keywords == {'eps': 1e-5, 'weight_decay': 0.05}
    opt = adamw([torch.nn.Parameter(torch.zeros(3))], lr=0.01)
    ft.test_eq((opt.param_groups[0]['eps'], opt.param_groups[0]['weight_decay']), (1e-5, 0.05))


def test_label_smoothing_loss_is_torchs():
    assert loss_func(0.0) is F.cross_entropy
    lf = loss_func(0.1)
    assert isinstance(lf, LabelSmoothingCrossEntropy)
    g = torch.Generator().manual_seed(0)
    pred, y = torch.randn(8, 10, generator=g), torch.randint(0, 10, (8,), generator=g)
    ft.test_close(lf(pred, y), F.cross_entropy(pred, y, label_smoothing=0.1), eps=1e-6)


def test_train_callbacks():
    ft.test_eq(train_callbacks('none', 0.0), [])
    cbs = train_callbacks('crop,flip,erase', 0.4)
    ft.test_eq([type(cb) for cb in cbs], [BatchTransform, MixUp])
    ft.test_eq(len(cbs[0].tfms), 3)
    assert cbs[0].on_train and not cbs[0].on_valid  # validation batches are never augmented
    ft.test_eq(cbs[1].alpha, 0.4)
    flip = train_callbacks('flip', 0)[0]
    ft.test_eq(flip.tfms, [random_flip])
    with pytest.raises(ValueError, match='--aug'):
        train_callbacks('mirror', 0)


def test_channels_last_comes_after_the_batch_transforms():
    cbs = train_callbacks('crop,flip', 0.4, True)
    ft.test_eq([type(cb) for cb in cbs], [BatchTransform, MixUp, ChannelsLast])
    assert all(cb._order < cbs[-1]._order for cb in cbs[:-1])
    ft.test_eq(train_callbacks('none', 0, True)[0].tfm, to_channels_last)
    with pytest.raises(ValueError, match="channels_last must be True or False, got 'yes'"):
        train_callbacks('none', 0, 'yes')
    x = torch.randn(4, 3, 8, 8)
    assert to_channels_last(x).is_contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous(memory_format=torch.channels_last)
    ft.test_eq(to_channels_last(x), x)
    flat = torch.randn(4, 10)
    assert to_channels_last(flat) is flat  # not a batch of images: as it is


class Formats(Callback):
    "The memory format of each batch the model gets, and of its 4-d weights, at each batch."

    _order = 20

    def __init__(self):
        self.batches, self.weights = [], []

    def begin_batch(self):
        last = torch.channels_last
        self.batches.append(self.xb.is_contiguous(memory_format=last))
        # a 1x1 kernel's weight, or one of one input channel, is in both formats at once
        weights = [p for p in self.model.parameters() if p.dim() == 4 and p[0].numel() > p.shape[1]]
        self.weights.append(all(p.is_contiguous(memory_format=last) for p in weights))


def test_channels_last_converts_the_model_and_every_batch():
    "Three channels (with one, a batch is in both formats at once): converted, trained alike."
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, 12, 12, generator=g), torch.randint(0, 5, (64,), generator=g)
    runs = []
    for channels_last in (False, True):
        torch.manual_seed(0)
        data = DataBunch(*get_dls(Dataset(x, y), Dataset(x[:32], y[:32]), 16), c=5)
        model = resnet_for(data)
        params = list(model.parameters())
        formats = Formats()
        # flip keeps the batch's format (random_crop's gather gives channels_last already)
        cbs = [*train_callbacks('flip', 0, channels_last), formats]
        # SGD: Adam's steps would magnify rounding where a gradient is near 0
        learn = Learner(data, model, lr=0.1, opt_func=SGD, metrics=[], cbs=cbs)
        learn.display = 'off'
        learn.fit(1)
        ft.test_eq(set(formats.batches) | set(formats.weights), {channels_last})
        ft.test_eq(len(formats.batches), 4 + 1)  # the validation batch too
        # converted in place: the optimizer's parameters are still the model's
        stepped = [p for group in learn.opt.param_groups for p in group['params']]
        assert all(p is q for p, q in zip(model.parameters(), params))
        assert len(stepped) == len(params) and all(p is q for p, q in zip(stepped, params))
        runs.append(model.state_dict())
    for k, v in runs[0].items():  # the same training, to float rounding
        ft.test_close(runs[1][k].float(), v.float(), eps=1e-4)


def test_resnet_for_the_data():
    x, y = torch.randn(16, 3, 20, 20), torch.randint(0, 7, (16,))
    data = DataBunch(*get_dls(Dataset(x, y), Dataset(x, y), 8), c=7)
    model = resnet_for(data)
    ft.test_eq(model(x).shape, (16, 7))


# ---------------- the trainer's options (exp.train with exp.recipes)


class Interrupt(Callback):
    "Ctrl-C at the end of epoch 0, after the trainer's SaveModelCallback wrote its checkpoint."

    _order = 50

    def after_epoch(self):
        if self.epoch == 0:
            raise KeyboardInterrupt


def small_folder(folder: Path) -> Path:
    "A folder of IDX files holding 256 train and 128 valid digits of the embedded set."
    x, y, xv, yv = get_data('mnist5k')
    as_bytes = lambda t: (t.view(-1, 28, 28) * 255).round().to(torch.uint8)  # noqa: E731
    folder.mkdir()
    for name, t in zip(IDX_FILES, (as_bytes(x[:256]), y[:256], as_bytes(xv[:128]), yv[:128])):
        write_idx(folder / name, t.to(torch.uint8))
    return folder


def test_arch_resnet_alone_takes_its_recipe():
    trainer = Trainer(arch='resnet', epochs=1)
    cfg, learn = trainer.cfg, trainer.learn
    ft.test_eq((cfg.bs, cfg.opt, cfg.wd, cfg.lr), (256, 'adamw', 0.01, None))
    ft.test_eq(learn.lr, RECIPES['resnet'].lr)
    assert isinstance(learn.opt, AdamW) and learn.loss_func is F.cross_entropy
    ft.test_eq(
        (learn.opt.param_groups[0]['eps'], learn.opt.param_groups[0]['weight_decay']), (1e-5, 0.01)
    )
    ft.test_eq(sum(p.numel() for p in learn.model.parameters()), 1_227_900)
    ft.test_eq(len(next(iter(learn.data.train_dl))[0]), 256)
    # the lesson models keep the trainer's defaults of before
    cnn = Trainer(epochs=1)
    ft.test_eq((cnn.cfg.bs, cnn.cfg.opt, cnn.cfg.wd), (32, 'sgd', 0.0))
    assert isinstance(cnn.learn.opt, SGD) and cnn.learn.opt.param_groups[0]['momentum'] == 0.9


def test_options_build_the_learner():
    trainer = Trainer(
        arch='mlp', epochs=1, opt='adamw', wd=0.05, aug='flip,crop', mixup=0.4, label_smoothing=0.1
    )
    cfg, learn = trainer.cfg, trainer.learn
    ft.test_eq((cfg.aug, cfg.mixup, cfg.label_smoothing), ('crop,flip', 0.4, 0.1))
    assert isinstance(learn.loss_func, LabelSmoothingCrossEntropy) and learn.loss_func.eps == 0.1
    ft.test_eq([type(cb) for cb in learn.cbs[1:]], [BatchTransform, MixUp])
    ft.test_eq(learn.opt.param_groups[0]['weight_decay'], 0.05)


@pytest.mark.parametrize(
    'args, message',
    [
        (['--aug', 'rotate'], "--aug must be none or some of crop, flip, erase"),
        (['--opt', 'adam'], '--opt must be one of sgd, adamw'),
        (['--wd', '-1'], '--wd must be a number from 0 to below 1'),
        (['--mixup', 'nan'], '--mixup must be a number from 0 (off) to 10'),
        (['--label-smoothing', '1'], '--label-smoothing must be a number from 0 to below 1'),
        (['--threads', '0'], '--threads must be a whole number from 1 to 1024'),
        (['--arch', 'vgg'], '--arch must be one of mlp, cnn, simple_cnn, resnet'),
    ],
)
def test_bad_options_are_one_line(args, message, tmp_path):
    out = subprocess.run(
        [sys.executable, '-m', 'exp.train', *args, '--out', str(tmp_path / 'run')],
        capture_output=True,
        text=True,
    )
    ft.test_eq(out.returncode, 2)
    ft.test_eq(out.stderr.count('\n'), 1)
    assert message in out.stderr, out.stderr
    assert not (tmp_path / 'run').exists() and not (tmp_path / 'run.partial').exists()


def test_threads_default_to_the_recipes(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
        ft.test_eq(set_threads(None, 'cnn'), 1)
        ft.test_eq(set_threads(3, 'cnn'), 3)
        monkeypatch.setenv('OMP_NUM_THREADS', '2')
        torch.set_num_threads(2)
        ft.test_eq(set_threads(None, 'cnn'), 2)  # the environment's, left as it is
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize('channels_last', [False, True])
def test_a_resnet_run_with_augmentation_resumes_exactly(tmp_path, capsys, channels_last):
    """A ResNet run (narrow, for speed: the recipe with 2 epochs) with crop, flip, mixup and label
    smoothing, stopped after epoch 0 and resumed: the weights of the run trained straight, bit for
    bit, and the options of its config.json honoured; in both memory formats."""
    data = small_folder(tmp_path / 'data')
    opts = dict(arch='resnet', data=str(data), epochs=2, bs=64, aug='crop,flip', mixup=0.4)
    opts |= dict(label_smoothing=0.1, threads=1, tta=True, channels_last=channels_last)
    straight = Trainer(**opts, out=tmp_path / 'straight')
    straight.fit()
    assert straight.tta is not None and 0 <= straight.tta <= 1
    stopped = Trainer(**opts, out=tmp_path / 'resumed')
    stopped.learn.cbs.append(Interrupt())
    with pytest.raises(KeyboardInterrupt):
        stopped.fit()
    config = json.loads((stopped.kept / 'config.json').read_text())
    ft.test_eq(
        {k: config[k] for k in ('aug', 'mixup', 'label_smoothing', 'opt', 'wd', 'bs')},
        {
            'aug': 'crop,flip',
            'mixup': 0.4,
            'label_smoothing': 0.1,
            'opt': 'adamw',
            'wd': 0.01,
            'bs': 64,
        },
    )
    ft.test_eq(config['channels_last'], channels_last)
    with pytest.raises(ValueError, match=r"--aug none \(the run's: --aug crop,flip\)"):
        Trainer(resume=stopped.kept, aug='none')
    flags = ['--no-channels-last', '--channels-last'][:: -1 if channels_last else 1]
    with pytest.raises(ValueError, match=rf"{flags[1]} \(the run's: {flags[0]}\)"):
        Trainer(resume=stopped.kept, channels_last=not channels_last)
    # the thread count and test-time augmentation are not the run's: a resume may change them
    other = Trainer(resume=stopped.kept, threads=2, tta=False)
    ft.test_eq((other.cfg.threads, other.cfg.tta, other.cfg.aug), (2, False, 'crop,flip'))
    resumed = Trainer(resume=stopped.kept)
    ft.test_eq((resumed.start_epoch, resumed.cfg.aug, resumed.cfg.mixup), (1, 'crop,flip', 0.4))
    ft.test_eq((resumed.cfg.threads, resumed.cfg.tta), (1, True))
    resumed.fit()
    a = torch.load(tmp_path / 'straight' / CHECKPOINT, weights_only=True)['model']
    b = torch.load(tmp_path / 'resumed' / CHECKPOINT, weights_only=True)['model']
    for k in a:
        ft.test_eq(a[k], b[k])
    ft.test_eq(resumed.tta, straight.tta)

"""The trainer's recipes (exp.recipes, notebook A13): option checks, and what is built from them."""

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test

from exp.augment import BatchTransform, LabelSmoothingCrossEntropy, MixUp, random_flip
from exp.callbacks import DataBunch
from exp.minibatch import Dataset, get_dls
from exp.optimizers import SGD, AdamW
from exp.recipes import AUGMENTS, OPTIMIZERS, RECIPES, check_aug, check_label_smoothing
from exp.recipes import check_mixup, check_opt, check_threads, check_wd, loss_func, opt_func
from exp.recipes import resnet_for, train_callbacks


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


def test_resnet_for_the_data():
    x, y = torch.randn(16, 3, 20, 20), torch.randint(0, 7, (16,))
    data = DataBunch(*get_dls(Dataset(x, y), Dataset(x, y), 8), c=7)
    model = resnet_for(data)
    ft.test_eq(model(x).shape, (16, 7))

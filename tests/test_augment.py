"""exp.augment: each augmentation keeps what it must (shape, dtype, labels, the validation set),
mixup mixes the batch and the loss as the course does, label smoothing equals PyTorch's, and
test-time augmentation equals averaging by hand. Seeds are stated where a test draws numbers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import exp.learner  # noqa: F401  (Learner.fit)
from exp.augment import (
    FASHION_CLASSES,
    BatchTransform,
    LabelSmoothingCrossEntropy,
    MixUp,
    NoneReduce,
    flip_lr,
    get_preds,
    get_tta,
    random_crop,
    random_erase,
    random_flip,
    reduce_loss,
    tta_predict,
)
from exp.callbacks import Callback, CancelTrainException, DataBunch, Learner
from exp.cnn import BatchTransformXCallback, view_tfm
from exp.data import set_seed
from exp.loss import cross_entropy
from exp.minibatch import Dataset, get_dls


def images(n=16, c=1, h=10, w=12, seed=0):
    "A batch of random images, `w` unlike `h` so that a flip along the wrong axis shows."
    return torch.randn(n, c, h, w, generator=torch.Generator().manual_seed(seed))


def tiny_data(n=48, bs=16, seed=0, flat=False):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2 * n, 1, 8, 8, generator=gen), torch.randint(0, 3, (2 * n,), generator=gen)
    x = x.view(2 * n, -1) if flat else x  # rows of 64 pixels
    return DataBunch(*get_dls(Dataset(x[:n], y[:n]), Dataset(x[n:], y[n:]), bs), c=3)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )


class RawBatches(Callback):
    "Each batch as the data loader gives it."

    _order = -1

    def begin_fit(self):
        self.batches = []

    def begin_batch(self):
        self.batches.append((self.in_train, self.xb, self.yb))


class SeenBatches(RawBatches):
    "Each batch as the model sees it, and each training loss."

    _order = 100

    def begin_fit(self):
        super().begin_fit()
        self.losses = []

    def after_loss(self):
        if self.in_train:
            self.losses.append(self.loss.detach())


def quiet(learn):
    learn.display = 'off'
    return learn


# ---------------- the augmentations


AUGMENTATIONS = {
    'random_crop': lambda x: random_crop(x, 3),
    'random_flip': random_flip,
    'flip_lr': flip_lr,
    'random_erase': random_erase,
}


@pytest.mark.parametrize('name', AUGMENTATIONS)
def test_shape_dtype_and_input_kept(name):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = images(c=3).to(dtype)
        before = x.clone()
        out = AUGMENTATIONS[name](x)
        assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
        assert torch.equal(x, before)  # a new tensor: the batch given is left as it was


@pytest.mark.parametrize('name', AUGMENTATIONS)
def test_refuses_what_is_not_a_batch_of_images(name):
    for bad in (torch.zeros(4, 10, 10), torch.zeros(2, 1, 4, 4, dtype=torch.long), [[0.0]]):
        with pytest.raises(TypeError, match=r'x must be a float tensor of images \(N, C, H, W\)'):
            AUGMENTATIONS[name](bad)


def test_flip_twice_is_the_identity_and_flips_left_to_right():
    x = images()
    assert torch.equal(flip_lr(flip_lr(x)), x)
    assert torch.equal(flip_lr(x)[..., 0], x[..., -1])
    assert torch.equal(random_flip(x, p=1.0), flip_lr(x))
    assert torch.equal(random_flip(x, p=0.0), x)


def test_random_flip_flips_each_image_or_leaves_it():
    x, gen = images(n=200), torch.Generator().manual_seed(1)
    out = random_flip(x, generator=gen)
    flipped = [torch.equal(o, f) for o, f in zip(out, flip_lr(x))]
    kept = [torch.equal(o, i) for o, i in zip(out, x)]
    assert all(f != k for f, k in zip(flipped, kept))
    assert 70 < sum(flipped) < 130  # p=0.5 over 200 images, seed 1


def test_crop_with_no_padding_is_the_identity():
    x = images(c=3)
    assert torch.equal(random_crop(x, pad=0), x)


def test_crop_is_a_window_of_the_padded_image_each_its_own():
    x, pad = images(n=64), 2
    out = random_crop(x, pad, fill=-5.0, generator=torch.Generator().manual_seed(2))
    padded = F.pad(x, (pad,) * 4, value=-5.0)
    offsets = []
    for o, p in zip(out, padded):
        found = [
            (i, j)
            for i in range(2 * pad + 1)
            for j in range(2 * pad + 1)
            if torch.equal(o, p[:, i : i + x.shape[2], j : j + x.shape[3]])
        ]
        assert len(found) == 1
        offsets += found
    assert len(set(offsets)) > 10  # not one offset for the whole batch (25 possible; seed 2)


def test_crop_repeats_with_a_seeded_generator_and_refuses_a_bad_pad():
    x = images()
    a = random_crop(x, 4, generator=torch.Generator().manual_seed(3))
    b = random_crop(x, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    set_seed(3)
    c = random_crop(x, 4)
    set_seed(3)
    assert torch.equal(c, random_crop(x, 4))
    for pad in (-1, 1.5, True):
        with pytest.raises(ValueError, match='pad must be an int >= 0'):
            random_crop(x, pad)


def test_erasing_touches_only_one_rectangle_per_image():
    x, pct = images(n=200, c=3, h=20, w=30), 0.2
    out = random_erase(x, pct=pct, max_num=1, generator=torch.Generator().manual_seed(4))
    changed = (out != x).any(1)  # (N, H, W)
    n_erased = 0
    for img in changed:
        if not img.any():
            continue
        n_erased += 1
        rows, cols = img.any(1).nonzero()[:, 0], img.any(0).nonzero()[:, 0]
        assert rows.max() - rows.min() < 4 and cols.max() - cols.min() < 6  # 4x6 (20% of 20x30)
    assert 60 < n_erased < 140  # 0 or 1 rectangle, equally likely (seed 4)
    assert out.min() >= x.min() and out.max() <= x.max()  # within the batch's range


def test_erasing_up_to_max_num_and_none_at_zero():
    x = images(n=50, h=20, w=20)
    assert torch.equal(random_erase(x, max_num=0), x)
    out = random_erase(x, pct=0.1, max_num=3, generator=torch.Generator().manual_seed(5))
    assert ((out != x).flatten(1).sum(1) <= 3 * 4).all()  # at most three 2x2 rectangles
    for kwargs, match in (({'pct': 0}, 'pct must be'), ({'max_num': -1}, 'max_num must be')):
        with pytest.raises(ValueError, match=match):
            random_erase(x, **kwargs)


def test_random_flip_refuses_a_bad_p():
    with pytest.raises(ValueError, match='p must be a number in'):
        random_flip(images(), p=1.5)


def test_fashion_classes():
    # one list of the names, the downloader's: the lesson's grid and `python -m exp.data` agree
    from exp.download import DATASETS

    assert FASHION_CLASSES is DATASETS['fashion']['classes']
    assert len(FASHION_CLASSES) == 10 and FASHION_CLASSES[9] == 'Ankle boot'


# ---------------- BatchTransform: training batches only


def test_batch_transform_changes_training_batches_only_and_keeps_labels():
    set_seed(6)
    learn = quiet(Learner(tiny_data(), tiny_model(), cbs=[BatchTransform([random_flip, flip_lr])]))
    raw, seen = RawBatches(), SeenBatches()
    learn.fit(2, cbs=[raw, seen])
    assert (
        len(raw.batches) == len(seen.batches) == 2 * (3 + 2)
    )  # 48 images: 3 batches of 16, 2 of 32
    for (in_train, x0, y0), (_, x1, y1) in zip(raw.batches, seen.batches):
        assert torch.equal(y0, y1)
        assert x1.shape == x0.shape and x1.dtype == x0.dtype
        assert not torch.equal(x1, x0) if in_train else torch.equal(x1, x0)


def test_batch_transform_in_order_on_valid_when_asked():
    calls = []
    tfms = [lambda x: calls.append('a') or x + 1, lambda x: calls.append('b') or x * 2]
    learn = quiet(Learner(tiny_data(), tiny_model(), cbs=[BatchTransform(tfms, False, True)]))
    raw, seen = RawBatches(), SeenBatches()
    learn.fit(1, cbs=[raw, seen])
    for (in_train, x0, _), (_, x1, _) in zip(raw.batches, seen.batches):
        assert torch.equal(x1, x0) if in_train else torch.equal(x1, (x0 + 1) * 2)
    assert calls[:2] == ['a', 'b']


def test_batch_transform_sees_images_after_the_view_transform():
    flat = tiny_data(flat=True)
    cbs = [BatchTransform(flip_lr), BatchTransformXCallback(view_tfm(1, 8, 8))]
    quiet(Learner(flat, tiny_model(), cbs=cbs)).fit(1)  # flip_lr refuses a flat batch


def test_batch_transform_refusals():
    with pytest.raises(TypeError, match='tfm must be a function'):
        BatchTransform(3)
    with pytest.raises(TypeError, match='tfm must be a function'):
        BatchTransform([])
    with pytest.raises(TypeError, match='on_train and on_valid must be bools'):
        BatchTransform(flip_lr, on_valid='yes')


# ---------------- mixup


def test_mixup_mixes_the_batch_and_the_loss_as_the_course_does():
    set_seed(7)
    mix, raw, seen = MixUp(0.4), RawBatches(), SeenBatches()
    learn = quiet(Learner(tiny_data(), tiny_model(), cbs=[mix]))
    learn.fit(1, cbs=[raw, seen, CancelAfterFirstLoss()])
    (_, x0, y0), (_, x1, _) = raw.batches[0], seen.batches[0]
    lam = mix.lam
    assert lam.shape == (len(x0),) and (lam >= 0.5).all() and (lam <= 1).all()
    assert sorted(mix.perm.tolist()) == list(range(len(x0)))
    assert torch.allclose(
        x1, lam.view(-1, 1, 1, 1) * x0 + (1 - lam.view(-1, 1, 1, 1)) * x0[mix.perm]
    )
    assert torch.equal(mix.yb1, y0[mix.perm])
    with torch.no_grad():
        pred = learn.model(x1)
    by_hand = lam * F.cross_entropy(pred, y0, reduction='none') + (1 - lam) * F.cross_entropy(
        pred, y0[mix.perm], reduction='none'
    )
    assert torch.allclose(seen.losses[0], by_hand.mean(), atol=1e-6)
    assert learn.loss_func is F.cross_entropy


class CancelAfterFirstLoss(Callback):
    _order = 101

    def after_loss(self):
        raise CancelTrainException()


def test_mixup_lambda_is_beta_then_max_and_seeded():
    "lam is max(l, 1 - l) of a Beta(alpha, alpha) draw per image, as course-v3 10b draws it."
    from types import SimpleNamespace

    from torch.distributions.beta import Beta

    x, y = images(n=64), torch.arange(64) % 3
    mix = MixUp(0.4)
    mix.set_runner(SimpleNamespace(in_train=True, xb=x, yb=y))
    torch.manual_seed(9)
    mix.begin_batch()
    torch.manual_seed(9)
    raw = Beta(torch.tensor(0.4), torch.tensor(0.4)).sample((64,))
    perm = torch.randperm(64)
    assert torch.equal(mix.lam, torch.max(raw, 1 - raw)) and torch.equal(mix.perm, perm)
    assert (raw < 0.5).any()  # some draws were turned round (seed 9)
    # with alpha 0.4 most draws lie near 0 or 1: most lams near 1
    assert (mix.lam > 0.9).float().mean() > 0.3

    def first_lam(seed):
        set_seed(seed)
        mix = MixUp(0.4)
        quiet(Learner(tiny_data(), tiny_model(), cbs=[mix])).fit(1, cbs=[CancelAfterFirstLoss()])
        return mix.lam

    assert torch.equal(first_lam(8), first_lam(8))
    run = SimpleNamespace(in_train=True, xb=x.double(), yb=y)
    mix.set_runner(run)
    mix.begin_batch()
    assert run.xb.dtype == torch.float64 and run.xb.shape == x.shape  # the batch's dtype kept


def test_mixup_loss_reduction_follows_the_loss_function():
    set_seed(10)
    for reduction in ('mean', 'sum'):
        loss_func = LabelSmoothingCrossEntropy(0.1, reduction)
        mix, seen = MixUp(1.0), SeenBatches()
        learn = quiet(Learner(tiny_data(), tiny_model(), loss_func=loss_func, cbs=[mix]))
        learn.fit(1, cbs=[seen, RawBatches(), CancelAfterFirstLoss()])
        x1 = seen.batches[0][1]
        with torch.no_grad():
            pred = learn.model(x1)
        per_item = LabelSmoothingCrossEntropy(0.1, 'none')
        y0 = mix.yb1[mix.perm.argsort()]
        mixed = mix.lam * per_item(pred, y0) + (1 - mix.lam) * per_item(pred, mix.yb1)
        assert torch.allclose(seen.losses[0], reduce_loss(mixed, reduction), atol=1e-5)
        assert loss_func.reduction == reduction  # put back


def test_mixup_validation_is_plain_and_the_loss_function_comes_back():
    set_seed(11)
    data = tiny_data()
    learn = quiet(Learner(data, tiny_model(), cbs=[MixUp(0.4)]))
    raw, seen = RawBatches(), SeenBatches()
    learn.fit(1, cbs=[raw, seen])
    for (in_train, x0, _), (_, x1, _) in zip(raw.batches, seen.batches):
        assert in_train or torch.equal(x0, x1)
    assert learn.loss_func is F.cross_entropy
    valid = learn.validate()
    with torch.no_grad():
        want = F.cross_entropy(learn.model(data.valid_ds.x), data.valid_ds.y)
    assert abs(valid['valid_loss'] - float(want)) < 1e-5

    class Boom(Callback):
        def after_loss(self):
            assert self.learn.loss_func is not F.cross_entropy  # MixUp's own, during training
            raise RuntimeError('boom')

    with pytest.raises(RuntimeError, match='boom'):
        learn.fit(1, cbs=[Boom()])
    assert learn.loss_func is F.cross_entropy  # even after an error


def test_mixup_refusals():
    for alpha in (0, -1, True, 'a'):
        with pytest.raises(ValueError, match='alpha must be a number > 0'):
            MixUp(alpha)
    with pytest.raises(TypeError, match='loss_func must have a `reduction`'):
        NoneReduce(cross_entropy)  # the series' own takes no reduction
    # refused as the fit begins, before any batch, and the learner's loss left as it was
    learn = quiet(Learner(tiny_data(), tiny_model(), loss_func=cross_entropy, cbs=[MixUp()]))
    with pytest.raises(TypeError, match='loss_func must have a `reduction`'):
        learn.fit(1)
    assert learn.loss_func is cross_entropy
    with pytest.raises(ValueError, match='reduction must be'):
        reduce_loss(torch.ones(3), 'avg')


def test_none_reduce_puts_the_attribute_back():
    loss_func = nn.CrossEntropyLoss()
    with NoneReduce(loss_func) as f:
        assert f(torch.randn(4, 3), torch.tensor([0, 1, 2, 0])).shape == (4,)
    assert loss_func.reduction == 'mean'
    with NoneReduce(F.cross_entropy) as f:
        assert f(torch.randn(4, 3), torch.tensor([0, 1, 2, 0])).shape == (4,)


# ---------------- label smoothing


@pytest.mark.parametrize('eps', [0.0, 0.1, 0.3, 1.0])
@pytest.mark.parametrize('reduction', ['mean', 'sum', 'none'])
def test_label_smoothing_equals_torch(eps, reduction):
    gen = torch.Generator().manual_seed(12)
    logits = (torch.randn(40, 7, generator=gen) * 3).double().requires_grad_()
    target = torch.randint(0, 7, (40,), generator=gen)
    ours = LabelSmoothingCrossEntropy(eps, reduction)(logits, target)
    theirs = F.cross_entropy(logits, target, reduction=reduction, label_smoothing=eps)
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    out_grad = torch.randn(theirs.shape, generator=gen, dtype=torch.float64)
    g_ours = torch.autograd.grad(ours, logits, out_grad)[0]
    g_theirs = torch.autograd.grad(theirs, logits, out_grad)[0]
    assert torch.allclose(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


def test_label_smoothing_in_float32_and_refusals():
    gen = torch.Generator().manual_seed(13)
    logits, target = torch.randn(16, 10, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    ours = LabelSmoothingCrossEntropy()(logits, target)
    assert LabelSmoothingCrossEntropy().eps == 0.1
    assert torch.allclose(ours, F.cross_entropy(logits, target, label_smoothing=0.1), atol=1e-6)
    for eps in (-0.1, 1.5, True, None):
        with pytest.raises(ValueError, match='eps must be a number in'):
            LabelSmoothingCrossEntropy(eps)
    with pytest.raises(ValueError, match='reduction must be'):
        LabelSmoothingCrossEntropy(0.1, 'avg')
    with pytest.raises(ValueError, match=r'output must be \(N, C\)'):
        LabelSmoothingCrossEntropy()(torch.randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


# ---------------- test-time augmentation


def test_tta_equals_averaging_by_hand():
    set_seed(14)
    data = tiny_data()
    learn = quiet(Learner(data, tiny_model(), cbs=[BatchTransform(random_flip)]))
    learn.fit(1)
    probs, targets = get_tta(learn)
    x, y = data.valid_ds.x, data.valid_ds.y
    model = learn.model.eval()
    with torch.no_grad():
        by_hand = (F.softmax(model(x), -1) + F.softmax(model(x.flip(-1)), -1)) / 2
        plain = F.softmax(model(x), -1)
    assert torch.equal(targets, y)
    assert torch.allclose(probs, by_hand, atol=1e-6)
    assert torch.allclose(get_preds(learn)[0], plain, atol=1e-6)
    assert torch.allclose(tta_predict(learn, x), by_hand, atol=1e-6)
    assert torch.allclose(probs.sum(1), torch.ones(len(y)))


def test_tta_goes_through_the_learners_callbacks():
    flat = tiny_data(flat=True)
    learn = quiet(Learner(flat, tiny_model(), cbs=[BatchTransformXCallback(view_tfm(1, 8, 8))]))
    probs, _ = get_tta(learn)
    x = flat.valid_ds.x.view(-1, 1, 8, 8)
    with torch.no_grad():
        by_hand = (F.softmax(learn.model(x), -1) + F.softmax(learn.model(x.flip(-1)), -1)) / 2
    assert torch.allclose(probs, by_hand, atol=1e-6)
    with pytest.raises(TypeError, match='tfm must be a function'):
        get_tta(learn, tfm=None)


# ---------------- on a GPU (skipped where there is none)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device here')


@cuda
def test_on_cuda_the_batch_stays_there_and_a_cpu_generator_still_draws():
    from exp.cnn import DeviceCallback

    x = images(c=3).cuda()
    for name, tfm in AUGMENTATIONS.items():
        assert tfm(x).device == x.device, name
    gen = torch.Generator().manual_seed(15)  # a CPU generator: the draws move to the batch
    for out in (random_crop(x, 2, generator=gen), random_flip(x, generator=gen)):
        assert out.device == x.device
    assert random_erase(x, generator=gen).device == x.device
    set_seed(15)
    data = tiny_data()
    cbs = [DeviceCallback('cuda'), BatchTransform(random_flip), MixUp(0.4)]
    learn = quiet(Learner(data, tiny_model(), cbs=cbs))
    learn.fit(1)
    probs, targets = get_tta(learn)
    model, xv = learn.model.eval(), data.valid_ds.x.cuda()
    with torch.no_grad():
        by_hand = (F.softmax(model(xv), -1) + F.softmax(model(xv.flip(-1)), -1)) / 2
    assert torch.allclose(probs, by_hand.cpu(), atol=1e-5)
    assert torch.allclose(tta_predict(learn, data.valid_ds.x), by_hand.cpu(), atol=1e-5)


def test_a_numpy_int_is_a_count_as_an_int_is():
    # a count from an array or a config is a numbers.Integral: it crops and erases as the int does
    x, seed = images(), lambda: torch.Generator().manual_seed(0)
    got = random_crop(x, pad=np.int64(2), generator=seed())
    assert torch.equal(got, random_crop(x, pad=2, generator=seed()))
    got = random_erase(x, max_num=np.int64(2), generator=seed())
    assert torch.equal(got, random_erase(x, max_num=2, generator=seed()))

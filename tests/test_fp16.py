"""Unit tests for exp.fp16: MixedPrecision's loss scales against torch.amp.GradScaler's, its steps
against fp32 training, on the CPU (and on CUDA where present)."""

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn, optim

from exp.batchnorm import BatchNorm1d, GroupNorm, LayerNorm, RunningBatchNorm
from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.data import set_seed
from exp.early_stopping import LRFinder
from exp.fp16 import (
    MixedPrecision,
    get_master,
    grad_overflow,
    model_to_half,
    to_bf16,
    to_fp16,
    to_master_grads,
    to_model_params,
)
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD, Adam

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device here')


def blobs(n=640, d=20, c=4, seed=0):
    "A small, learnable classification problem: Gaussian blobs."
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(c, d, generator=g) * 2
    y = torch.randint(0, c, (n,), generator=g)
    return centres[y] + torch.randn(n, d, generator=g), y


def make_data(bs=32, n=640):
    x, y = blobs(n)
    train_ds, valid_ds = (
        Dataset(x[: n * 3 // 4], y[: n * 3 // 4]),
        Dataset(x[n * 3 // 4 :], y[n * 3 // 4 :]),
    )
    return DataBunch(
        DataLoader(train_ds, Sampler(train_ds, bs, shuffle=True, seed=1)),
        DataLoader(valid_ds, Sampler(valid_ds, bs * 2)),
        c=4,
    )


# the batch norm tests run with torch's batch norm and with the series' own (exp.batchnorm)
NORMS = pytest.mark.parametrize('norm', [nn.BatchNorm1d, BatchNorm1d], ids=['torch_bn', 'our_bn'])


def bn_mlp(norm=nn.BatchNorm1d):
    return nn.Sequential(nn.Linear(20, 16), norm(16), nn.ReLU(), nn.Linear(16, 4))


class InjectInf(Callback):
    _order = 50  # before MixedPrecision (99) looks at the gradients

    def __init__(self, iters, value=float('inf')):
        self.iters, self.value = set(iters), value

    def after_backward(self):
        if self.n_iter in self.iters:
            self.model[0].weight.grad.view(-1)[3] = self.value


class Trace(Callback):
    """After every training batch: the loss scale, the fp32 view of the parameters and the optimizer
    state."""

    _order = 100

    def begin_fit(self):
        self.scales, self.params, self.states = [], [], []

    def after_batch(self):
        if not self.in_train:
            return
        self.scales.append(self.mixed_precision.loss_scale)
        self.params.append([p.detach().float().clone() for p in self.model.parameters()])
        self.states.append(
            [
                {k: v.clone() for k, v in self.opt.state[p].items()}
                for pg in self.opt.param_groups
                for p in pg['params']
                if p in self.opt.state
            ]
        )


def gradscaler_scales(n_batches, inject, init_scale, interval, device='cpu'):
    """The scale GradScaler holds after each of `n_batches` steps, with an inf injected on the
    `inject` steps."""
    set_seed(0)
    model = bn_mlp().to(device)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=interval)
    x, y = torch.randn(8, 20, device=device), torch.randint(0, 4, (8,), device=device)
    scales = []
    for i in range(n_batches):
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        if i in inject:
            model[0].weight.grad.view(-1)[3] = float('inf')
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    return scales


OPT_FUNCS = {'sgd': partial(SGD, momentum=0.9), 'adam': lambda ps, lr: Adam(ps, lr=1e-2)}


@pytest.mark.parametrize('opt_func', OPT_FUNCS.values(), ids=OPT_FUNCS.keys())
@pytest.mark.parametrize('flat_master', [False, True])
@pytest.mark.parametrize('value', [float('inf'), float('nan')])
def test_scale_and_skipped_steps_match_gradscaler(flat_master, value, opt_func):
    # on a skipped step nothing moves: weights, momentum buffers, Adam's averages and its step count
    inject = [0, 3, 4, 9, 10, 11, 15]
    set_seed(0)
    learn = Learner(make_data(), bn_mlp(), lr=0.1, opt_func=opt_func)
    to_fp16(learn, loss_scale=2.0**8, max_noskip=3, flat_master=flat_master)
    run = Runner(cbs=[InjectInf(inject, value), Trace()])
    run.fit(1, learn)  # 15 training batches
    trace = run.trace
    ft.test_eq(trace.scales, gradscaler_scales(len(trace.scales), inject, 2.0**8, 3))
    ft.test_eq(run.mixed_precision.skipped, len([i for i in inject if i < len(trace.scales)]))
    for i in inject:
        if i == 0 or i >= len(trace.scales):
            continue
        for a, b in zip(trace.params[i - 1], trace.params[i]):
            assert torch.equal(a, b), f'parameters moved on batch {i}'
        for sa, sb in zip(trace.states[i - 1], trace.states[i]):
            for k in sa:
                assert torch.equal(sa[k], sb[k]), f'optimizer state {k} moved on batch {i}'
    # and on the good batches they do move
    assert not torch.equal(trace.params[1][0], trace.params[2][0])


def test_growth_is_capped_by_max_scale():
    learn = Learner(make_data(), bn_mlp(), lr=0.1)
    to_fp16(learn, loss_scale=2.0**4, max_noskip=1, max_scale=2.0**6)
    run = Runner(cbs=[Trace()])
    run.fit(1, learn)
    ft.test_eq(run.trace.scales[:4], [2.0**5, 2.0**6, 2.0**6, 2.0**6])


def test_static_scale_stays_put():
    learn = Learner(make_data(), bn_mlp(), lr=0.1)
    to_fp16(learn, dynamic=False)
    run = Runner(cbs=[Trace()])
    run.fit(2, learn)
    ft.test_eq(set(run.trace.scales), {512.0})


def test_model_is_fp32_with_master_weights_after_fit_and_after_an_exception():
    class Stop(Callback):
        _order = 200

        def __init__(self, exc):
            self.exc = exc

        def after_step(self):
            self.masters = [
                m.detach().clone() for pg in self.mixed_precision.master_pgs for m in pg
            ]
            if self.exc and self.n_iter == 2:
                raise self.exc

    for raises in (None, KeyboardInterrupt):
        learn = to_fp16(Learner(make_data(), bn_mlp(), lr=0.1))
        stop = Stop(raises)
        run = Runner(cbs=[stop])
        if raises:
            with pytest.raises(raises):
                run.fit(1, learn)
        else:
            run.fit(1, learn)
        ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
        # the fp32 masters, exactly
        for p, m in zip(learn.model.parameters(), stop.masters):
            ft.test_eq(p.detach(), m)
        # released: the model's own parameters are the weights again
        assert run.mixed_precision.master_pgs is None
        opt_params = [p for pg in learn.opt.param_groups for p in pg['params']]
        assert len(opt_params) == 6 and all(
            a is b for a, b in zip(opt_params, learn.model.parameters())
        )


def opt_state(learn):
    "A copy of the optimizer's state of each of the model's parameters."
    return [{k: v.clone() for k, v in learn.opt.state[p].items()} for p in learn.model.parameters()]


def assert_same_states(got, want):
    for a, b in zip(got, want, strict=True):
        ft.test_eq(sorted(a), sorted(b))
        for k in a:
            assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize('opt_func', OPT_FUNCS.values(), ids=OPT_FUNCS.keys())
def test_optimizer_state_kept_across_the_switch(opt_func):
    set_seed(0)
    learn = Learner(make_data(), bn_mlp(), lr=0.1, opt_func=opt_func)
    Runner().fit(1, learn)  # fp32: momentum buffers, Adam's averages and step counts exist now
    before = opt_state(learn)

    class Peek(Callback):
        _order = 100

        def begin_fit(self):
            masters = [p for pg in self.opt.param_groups for p in pg['params']]
            self.seen = [{k: v.clone() for k, v in self.opt.state[m].items()} for m in masters]

    peek = Peek()
    to_fp16(learn, flat_master=False)
    run = Runner(cbs=[peek])
    run.fit(0, learn)  # begin_fit and after_fit only
    for states in (peek.seen, opt_state(learn)):
        assert_same_states(states, before)


@pytest.mark.parametrize('opt_func', OPT_FUNCS.values(), ids=OPT_FUNCS.keys())
def test_flat_master_keeps_state_and_mixed_dtypes(opt_func):
    set_seed(0)
    learn = Learner(make_data(), bn_mlp(), lr=0.1, opt_func=opt_func)
    Runner().fit(1, learn)
    before = opt_state(learn)
    to_fp16(learn, flat_master=True)
    run = Runner()
    run.fit(0, learn)
    assert_same_states(opt_state(learn), before)
    # the one group mixes fp16 weights and fp32 batch norm parameters; train with it
    run.fit(1, learn)
    ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
    if 'step' in before[0]:
        # each parameter got its own step count back: one shared tensor would be counted once per
        # parameter
        steps = [learn.opt.state[p]['step'] for p in learn.model.parameters()]
        assert len({id(s) for s in steps}) == len(steps)
        learn.cbs = []
        Runner().fit(1, learn)
        ft.test_eq(
            [float(learn.opt.state[p]['step']) for p in learn.model.parameters()],
            [3.0 * len(learn.data.train_dl)] * 6,
        )


def test_flat_master_refuses_frozen_parameters():
    model = bn_mlp()
    model[0].weight.requires_grad_(False)
    learn = to_fp16(Learner(make_data(), model, lr=0.1), flat_master=True)
    with pytest.raises(ValueError, match='flat_master=True needs every parameter'):
        Runner().fit(1, learn)


def test_frozen_parameters_stay_put_without_flat_master():
    model = bn_mlp()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    learn = to_fp16(Learner(make_data(), model, lr=0.1, opt_func=partial(SGD, weight_decay=0.1)))
    Runner().fit(1, learn)
    # exactly: the masters were copied before rounding to fp16
    ft.test_eq(learn.model[0].weight.detach(), frozen)


@NORMS
def test_pieces(norm):
    model = model_to_half(bn_mlp(norm))
    ft.test_eq(
        [p.dtype for p in model.parameters()],
        [torch.half] * 2 + [torch.float] * 2 + [torch.half] * 2,
    )
    opt = SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 20).half()).float().sum().backward()
    for flat in (False, True):
        pgs, masters = get_master(opt, flat)
        to_master_grads(pgs, masters, flat)
        got = masters[0][0].grad if flat else torch.cat([m.grad.reshape(-1) for m in masters[0]])
        ft.test_eq(got, torch.cat([p.grad.float().reshape(-1) for p in pgs[0]]))
        assert not grad_overflow(masters)
        with torch.no_grad():
            for m in masters[0]:
                m.mul_(2)
        before = [p.detach().float().clone() for p in pgs[0]]
        to_model_params(pgs, masters, flat)
        for b, p in zip(before, pgs[0]):
            ft.test_close(p.float(), b * 2, eps=1e-3)


def test_the_courses_names():
    """course-v3's 10c_fp16: get_master(opt, flat_master) -> (model_pgs, master_pgs); grad_overflow
    over parameter groups."""
    model = bn_mlp()
    opt = SGD(
        [
            {'params': model[0].parameters()},
            {'params': [*model[1].parameters(), *model[3].parameters()]},
        ],
        lr=0.1,
    )
    model_pgs, master_pgs = get_master(opt)
    # its own
    ft.test_eq(
        [list(map(id, pg)) for pg in model_pgs],
        [list(map(id, pg['params'])) for pg in opt.param_groups],
    )
    for pg, mpg in zip(model_pgs, master_pgs):
        for p, m in zip(pg, mpg):
            assert m is not p and m.dtype == torch.float32 and m.requires_grad
            ft.test_eq(m.detach(), p.detach())
    _, flat = get_master(opt, flat_master=True)
    ft.test_eq(
        [[m.numel() for m in mpg] for mpg in flat],
        [[sum(p.numel() for p in pg)] for pg in model_pgs],
    )
    for pg, mpg in zip(model_pgs, master_pgs):
        for p, m in zip(pg, mpg):
            m.grad = torch.ones_like(m)
    assert not grad_overflow(master_pgs)
    master_pgs[1][-1].grad[0] = float('inf')  # in the second group only
    assert grad_overflow(master_pgs)
    master_pgs[1][-1].grad[0] = float('nan')
    assert grad_overflow(master_pgs)
    # no gradient at all: nothing overflows
    assert not grad_overflow([[nn.Parameter(torch.ones(2))]])


def test_loss_fp32():
    """fastai v1's loss_fp32: True (the default) computes the loss on an fp32 output; False on the
    half one."""
    dtypes = []

    class Watch(Callback):
        _order = 150  # after MixedPrecision's after_pred

        def after_pred(self):
            if self.in_train:
                dtypes.append(self.pred.dtype)

    for loss_fp32, dtype in ((True, torch.float32), (False, torch.float16)):
        dtypes.clear()
        set_seed(0)
        learn = to_fp16(
            Learner(make_data(), bn_mlp(), lr=0.1, metrics=[accuracy]), loss_fp32=loss_fp32
        )
        run = Runner(cbs=[Watch()])
        run.fit(1, learn)
        ft.test_eq(set(dtypes), {dtype})
        loss, acc = run.avg_stats.valid_stats.avg_stats
        # summed in fp32 either way
        assert math.isfinite(loss) and acc > 0.5, (loss_fp32, loss, acc)
    with pytest.raises(TypeError, match='loss_fp32 must be True or False'):
        MixedPrecision(loss_fp32='no')


def test_with_an_lr_finder_the_weights_are_as_before():
    """LRFinder saves the fp32 weights before MixedPrecision halves them and restores them after it
    has put the masters back."""
    for flat in (False, True):
        set_seed(0)
        learn = to_fp16(
            Learner(make_data(), bn_mlp(), lr=0.1, opt_func=partial(SGD, momentum=0.9)),
            flat_master=flat,
        )
        Runner().fit(1, learn)  # momentum buffers to restore, too
        before = [p.detach().clone() for p in learn.model.parameters()]
        state = {k: v.clone() for k, v in learn.opt.state[next(learn.model.parameters())].items()}
        run = Runner(cbs=[LRFinder(max_iter=10)])
        run.fit(1, learn)
        # it ran, and gave its copy back
        assert len(run.lr_finder.model_state or {}) == 0 and run.n_iter > 1
        for p, q in zip(before, learn.model.parameters()):
            ft.test_eq(p, q.detach())
        after = learn.opt.state[next(learn.model.parameters())]
        for k in state:
            ft.test_eq(after[k], state[k])
        ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})


def test_state_dict_round_trip_and_checks():
    mp = MixedPrecision(loss_scale=2.0**10)
    mp.noskip, mp.skipped = 3, 2
    other = MixedPrecision()
    other.load_state_dict(mp.state_dict())
    ft.test_eq((other.loss_scale, other.noskip, other.skipped), (2.0**10, 3, 2))
    for bad in (
        {'loss_scale': -1.0, 'noskip': 0, 'skipped': 0},
        {'loss_scale': 2.0**30, 'noskip': 0, 'skipped': 0},
        {'loss_scale': 8.0, 'noskip': -1, 'skipped': 0},
        {'loss_scale': 8.0},
        None,
    ):
        with pytest.raises(ValueError, match='a MixedPrecision state holds'):
            other.load_state_dict(bad)
    ft.test_eq(other.loss_scale, 2.0**10)  # a refused state changes nothing
    assert other.fp32_state() is None  # outside a fit the model's own state is the checkpoint's


def test_arguments_are_checked():
    with pytest.raises(ValueError, match='dtype must be'):
        MixedPrecision(dtype=torch.float32)
    with pytest.raises(ValueError, match='max_noskip must be an int >= 1, got 0'):
        MixedPrecision(max_noskip=0)
    with pytest.raises(ValueError, match='clip must be > 0'):
        MixedPrecision(clip=0)
    with pytest.raises(ValueError, match='loss_scale <= max_scale'):
        MixedPrecision(loss_scale=2.0**30)


def test_defaults():
    ft.test_eq(MixedPrecision().loss_scale, 2.0**16)
    ft.test_eq(MixedPrecision(dynamic=False).loss_scale, 512.0)
    mp = MixedPrecision(dtype=torch.bfloat16)
    ft.test_eq((mp.loss_scale, mp.dynamic), (1.0, False))
    learn = to_fp16(to_fp16(Learner(make_data(), bn_mlp())))
    ft.test_eq(len(learn.cbs), 1)  # a second to_fp16 replaces the first


def test_recorded_loss_is_unscaled():
    losses = []

    class Rec(Callback):
        _order = 150

        def after_batch(self):
            if self.in_train:
                losses.append(self.loss.item())

    set_seed(0)
    learn = to_fp16(Learner(make_data(), bn_mlp(), lr=0.1))
    Runner(cbs=[Rec()]).fit(1, learn)
    assert max(losses) < 10, losses  # the cross entropy of 4 classes, not 65,536 times it


def train_accuracy(convert, epochs=4, device='cpu', norm=nn.BatchNorm1d):
    set_seed(0)
    learn = Learner(make_data(), bn_mlp(norm), lr=0.2, metrics=[accuracy])
    if convert:
        convert(learn)
    cbs = []
    if device != 'cpu':
        from exp.cnn import DeviceCallback

        cbs.append(DeviceCallback(device))
    run = Runner(cbs=cbs)
    run.fit(epochs, learn)
    return run.avg_stats.valid_stats.avg_stats[1]


@NORMS
def test_fp16_and_bf16_reach_fp32_accuracy(norm, capsys):
    # seed 0, blobs, BN-MLP, lr 0.2, 4 epochs: every precision reaches 1.0 on these blobs, so this
    # only catches a breakdown; test_one_step_moves_the_weights_as_fp32_does below catches a wrong
    # step
    acc32 = train_accuracy(None, norm=norm)
    assert acc32 > 0.9
    for convert in (to_fp16, lambda learn: to_fp16(learn, flat_master=True), to_bf16):
        assert abs(train_accuracy(convert, norm=norm) - acc32) <= 0.02


@NORMS
@pytest.mark.parametrize(
    'convert, tol',
    [(to_fp16, 1e-2), (partial(to_fp16, flat_master=True), 1e-2), (to_bf16, 2e-2)],
    ids=['fp16', 'fp16_flat', 'bf16'],
)
def test_one_step_moves_the_weights_as_fp32_does(norm, convert, tol, capsys):
    """One SGD step on one batch of 480: the master weights move as fp32's do, to half precision's
    rounding (measured 0.002-0.0034)."""

    def step(convert):
        set_seed(0)
        # the 480 training samples: one batch
        learn = Learner(make_data(bs=480), bn_mlp(norm), lr=0.2)
        before = [p.detach().clone() for p in learn.model.parameters()]
        if convert:
            convert(learn)
        Runner().fit(1, learn)
        return torch.cat(
            [(p.detach().float() - b).flatten() for p, b in zip(learn.model.parameters(), before)]
        )

    moved32, moved = step(None), step(convert)
    # a gradient unscaled 10% off would be an error of 0.1 here
    assert (moved - moved32).norm() / moved32.norm() < tol


@pytest.mark.parametrize(
    'norm',
    [nn.BatchNorm1d(16), BatchNorm1d(16), LayerNorm(16), GroupNorm(4, 16), RunningBatchNorm(16)],
    ids=['torch_bn', 'our_bn', 'our_ln', 'our_gn', 'our_running_bn'],
)
def test_model_to_half_keeps_norm_layers_in_fp32(norm):
    set_seed(0)
    model = nn.Sequential(nn.Linear(20, 16), norm, nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
    ref = [p.detach().clone() for p in model[1].parameters()]
    x = torch.randn(32, 20)
    want = model(x).detach()
    model_to_half(model)
    for p, r in zip(model[1].parameters(), ref):
        ft.test_eq(p.detach(), r)  # fp32, not even rounded
    ft.test_eq(
        {b.dtype for b in model[1].buffers() if b.is_floating_point()} or {torch.float32},
        {torch.float32},
    )
    out = model(x.half())
    ft.test_eq(out.dtype, torch.half)
    ft.test_close(out.float(), want, eps=0.05)  # the half linear layers' rounding


@cuda
def test_on_cuda():
    acc32 = train_accuracy(None, device='cuda')
    for convert in (to_fp16, to_bf16, lambda learn: to_fp16(learn, flat_master=True)):
        assert abs(train_accuracy(convert, device='cuda') - acc32) <= 0.02


@cuda
def test_scales_match_gradscaler_on_cuda():
    from exp.cnn import DeviceCallback

    inject = [1, 2, 6]
    set_seed(0)
    learn = to_fp16(Learner(make_data(), bn_mlp(), lr=0.1), loss_scale=2.0**8, max_noskip=2)
    run = Runner(cbs=[DeviceCallback('cuda'), InjectInf(inject), Trace()])
    run.fit(1, learn)
    ft.test_eq(
        run.trace.scales, gradscaler_scales(len(run.trace.scales), inject, 2.0**8, 2, device='cuda')
    )


# ---------------- when steps keep being skipped

from exp.callbacks import NonFiniteError


def fp16_learner(**kwargs):
    set_seed(0)
    learn = Learner(make_data(), bn_mlp(), F.cross_entropy, lr=0.1)
    return to_fp16(learn, **kwargs)


def test_overflow_at_the_floor_stops_the_fit_naming_epoch_and_batch():
    """Every step from batch 20 overflows (as a nan in the data, or a diverged model, makes them):
    2**6 halves to the floor in 6 skips."""
    learn = fp16_learner(loss_scale=2.0**6)
    run = Runner(cbs=[InjectInf(range(20, 10**6), float('nan'))])
    n = len(learn.data.train_dl)  # 15 batches an epoch
    with pytest.raises(
        NonFiniteError,
        match=f'gradients are not finite at epoch 1, batch {26 - n}, with the loss scale at its '
        'floor '
        r'\(min_scale=1; 6 steps skipped in all\)',
    ):
        run.fit(5, learn)
    ft.test_eq(run.mixed_precision.loss_scale, 1.0)
    # torn down all the same
    ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})


def test_a_few_bad_batches_are_skipped_and_training_goes_on():
    learn = fp16_learner(loss_scale=2.0**6)
    run = Runner(cbs=[InjectInf([3, 17])])
    run.fit(2, learn)
    ft.test_eq((run.mixed_precision.skipped, run.mixed_precision.loss_scale), (2, 2.0**4))


def test_the_floor_can_be_set_and_an_lr_finder_just_ends_there():
    learn = fp16_learner(loss_scale=2.0**6, min_scale=2.0**4)
    run = Runner(cbs=[InjectInf(range(0, 10**6))])
    with pytest.raises(NonFiniteError, match='min_scale=16; 2 steps skipped'):
        run.fit(1, learn)
    learn = fp16_learner(loss_scale=2.0**6)
    finder = LRFinder(max_iter=50)
    run = Runner(cbs=[finder, InjectInf(range(5, 10**6))])
    run.fit(5, learn)  # ended by the floor: a CancelTrainException, no error
    ft.test_eq(run.mixed_precision.loss_scale, 1.0)


@pytest.mark.parametrize(
    'kwargs,message',
    [
        (
            dict(loss_scale=1e-10),
            'loss_scale=1e-10 is too small for float16, whose smallest positive number is '
            '2\\*\\*-24',
        ),
        (dict(loss_scale=float('inf')), 'loss_scale must be a finite number > 0, got inf'),
        (dict(loss_scale=float('nan')), 'loss_scale must be a finite number > 0, got nan'),
        (dict(loss_scale=True), 'loss_scale must be a finite number > 0, got True'),
        (dict(loss_scale=0.0), 'loss_scale must be a finite number > 0, got 0.0'),
        (dict(min_scale=2.0**-30), 'min_scale=9.31323e-10 is too small for float16'),
        (
            dict(loss_scale=1.0, min_scale=2.0),
            'need min_scale <= loss_scale <= max_scale, got 2, 1, 1.67772e\\+07',
        ),
    ],
)
def test_a_loss_scale_fp16_cannot_use_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MixedPrecision(**kwargs)
    MixedPrecision(loss_scale=2.0**-24, min_scale=2.0**-24)  # the smallest it can hold


def test_a_raising_after_fit_ordered_before_mixed_precision_leaves_the_model_fp32():
    """Its after_fit runs first (teardown is in reverse); mixed precision's still runs, and the next
    fit trains."""

    class LateTeardown(Callback):
        _order = 200

        def after_fit(self):
            raise RuntimeError('teardown failed')

    learn = fp16_learner()
    with pytest.raises(RuntimeError, match='teardown failed'):
        Runner(cbs=[LateTeardown()]).fit(1, learn)
    ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
    model_params = set(map(id, learn.model.parameters()))
    # the model's own again
    ft.test_eq({id(p) for pg in learn.opt.param_groups for p in pg['params']}, model_params)
    Runner().fit(1, learn)  # and the next fit trains


EVENTS_THAT_FAIL = (
    'begin_fit',
    'begin_batch',
    'after_backward',
    'after_step',
    'after_epoch',
    'after_fit',
)


def fail_at(event: str, order: int) -> Callback:
    """A callback that raises RuntimeError at `event` (in training batch 2 for the batch events),
    ordered before or after MixedPrecision."""

    def fail(self):
        if event in ('begin_fit', 'after_epoch', 'after_fit') or (
            self.in_train and self.n_iter == 2
        ):
            raise RuntimeError(f'failed at {event}')

    return type('FailAt', (Callback,), {'_order': order, event: fail})()


@pytest.mark.parametrize('order', [50, 200], ids=['before_mp', 'after_mp'])
@pytest.mark.parametrize(
    'event,flat_master',
    [(e, False) for e in EVENTS_THAT_FAIL] + [('after_backward', True), ('after_fit', True)],
)
def test_a_failure_at_any_event_leaves_the_model_fp32_with_its_own_parameters_in_the_optimizer(
    event, flat_master, order
):
    learn = fp16_learner(flat_master=flat_master)
    model_params = [id(p) for p in learn.model.parameters()]
    with pytest.raises(RuntimeError, match=f'failed at {event}'):
        Runner(cbs=[fail_at(event, order)]).fit(1, learn)
    ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
    ft.test_eq([id(p) for pg in learn.opt.param_groups for p in pg['params']], model_params)
    assert all(p.grad is None for p in learn.model.parameters())
    before = [p.detach().clone() for p in learn.model.parameters()]
    Runner().fit(1, learn)  # the next fit trains, in fp16 again, and moves the model's own weights
    assert any(not torch.equal(p, b) for p, b in zip(learn.model.parameters(), before))
    ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})


def test_options_of_the_wrong_type_are_refused_in_one_line():
    "clip='1' failed with Python's own words ('>' not supported...); a flag must be a bool."
    for kwargs, exc, message in [
        (dict(clip='1'), TypeError, "clip must be a number > 0 or None, got '1'"),
        (dict(clip=float('inf')), ValueError, 'clip must be > 0 or None, got inf'),
        (dict(dynamic='yes'), TypeError, "dynamic must be True or False, got 'yes'"),
        (dict(flat_master=1), TypeError, 'flat_master must be True or False, got 1'),
    ]:
        ft.test_fail(lambda: MixedPrecision(**kwargs), exc=exc, contains=message)


def test_max_noskip_refuses_a_bool():
    # True is an int to Python: max_noskip=True grew the scale after every step, as 1 would
    with pytest.raises(ValueError, match='max_noskip must be an int >= 1, got True'):
        MixedPrecision(max_noskip=True)

"""Unit tests for exp.fp16: MixedPrecision against torch.amp.GradScaler, on the CPU (and on CUDA where present)."""
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn, optim

from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.data import set_seed
from exp.fp16 import MixedPrecision, get_master, grads_overflow, master_to_model, model_grads_to_master, model_to_half, to_bf16, to_fp16
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
    train_ds, valid_ds = Dataset(x[:n * 3 // 4], y[:n * 3 // 4]), Dataset(x[n * 3 // 4:], y[n * 3 // 4:])
    return DataBunch(DataLoader(train_ds, Sampler(train_ds, bs, shuffle=True, seed=1)),
                     DataLoader(valid_ds, Sampler(valid_ds, bs * 2)), c=4)


def bn_mlp():
    return nn.Sequential(nn.Linear(20, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


class InjectInf(Callback):
    _order = 50  # before MixedPrecision (99) looks at the gradients

    def __init__(self, iters, value=float('inf')): self.iters, self.value = set(iters), value

    def after_backward(self):
        if self.n_iter in self.iters: self.model[0].weight.grad.view(-1)[3] = self.value


class Trace(Callback):
    "After every training batch: the loss scale, the fp32 view of the parameters and the optimizer state."
    _order = 100

    def begin_fit(self): self.scales, self.params, self.states = [], [], []

    def after_batch(self):
        if not self.in_train: return
        self.scales.append(self.mixed_precision.loss_scale)
        self.params.append([p.detach().float().clone() for p in self.model.parameters()])
        self.states.append([{k: v.clone() for k, v in self.opt.state[p].items()}
                            for pg in self.opt.param_groups for p in pg['params'] if p in self.opt.state])


def gradscaler_scales(n_batches, inject, init_scale, interval, device='cpu'):
    "The scale GradScaler holds after each of `n_batches` steps, with an inf injected on the `inject` steps."
    set_seed(0)
    model = bn_mlp().to(device)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=interval)
    x, y = torch.randn(8, 20, device=device), torch.randint(0, 4, (8,), device=device)
    scales = []
    for i in range(n_batches):
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        if i in inject: model[0].weight.grad.view(-1)[3] = float('inf')
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
    to_fp16(learn, loss_scale=2.**8, max_noskip=3, flat_master=flat_master)
    run = Runner(cbs=[InjectInf(inject, value), Trace()])
    run.fit(1, learn)  # 15 training batches
    trace = run.trace
    ft.test_eq(trace.scales, gradscaler_scales(len(trace.scales), inject, 2.**8, 3))
    ft.test_eq(run.mixed_precision.skipped, len([i for i in inject if i < len(trace.scales)]))
    for i in inject:
        if i == 0 or i >= len(trace.scales): continue
        for a, b in zip(trace.params[i - 1], trace.params[i]): assert torch.equal(a, b), f'parameters moved on batch {i}'
        for sa, sb in zip(trace.states[i - 1], trace.states[i]):
            for k in sa: assert torch.equal(sa[k], sb[k]), f'optimizer state {k} moved on batch {i}'
    # and on the good batches they do move
    assert not torch.equal(trace.params[1][0], trace.params[2][0])


def test_growth_is_capped_by_max_scale():
    learn = Learner(make_data(), bn_mlp(), lr=0.1)
    to_fp16(learn, loss_scale=2.**4, max_noskip=1, max_scale=2.**6)
    run = Runner(cbs=[Trace()])
    run.fit(1, learn)
    ft.test_eq(run.trace.scales[:4], [2.**5, 2.**6, 2.**6, 2.**6])


def test_static_scale_stays_put():
    learn = Learner(make_data(), bn_mlp(), lr=0.1)
    to_fp16(learn, dynamic=False)
    run = Runner(cbs=[Trace()])
    run.fit(2, learn)
    ft.test_eq(set(run.trace.scales), {512.})


def test_model_is_fp32_with_master_weights_after_fit_and_after_an_exception():
    class Stop(Callback):
        _order = 200
        def __init__(self, exc): self.exc = exc
        def after_step(self):
            self.masters = [m.detach().clone() for pg in self.mixed_precision.master_pgs for m in pg]
            if self.exc and self.n_iter == 2: raise self.exc
    for raises in (None, KeyboardInterrupt):
        learn = to_fp16(Learner(make_data(), bn_mlp(), lr=0.1))
        stop = Stop(raises)
        run = Runner(cbs=[stop])
        if raises:
            with pytest.raises(raises): run.fit(1, learn)
        else: run.fit(1, learn)
        ft.test_eq({p.dtype for p in learn.model.parameters()}, {torch.float32})
        for p, m in zip(learn.model.parameters(), stop.masters): ft.test_eq(p.detach(), m)  # the fp32 masters, exactly
        assert run.mixed_precision.master_pgs is None  # released: the model's own parameters are the weights again
        opt_params = [p for pg in learn.opt.param_groups for p in pg['params']]
        assert len(opt_params) == 6 and all(a is b for a, b in zip(opt_params, learn.model.parameters()))


def opt_state(learn):
    "A copy of the optimizer's state of each of the model's parameters."
    return [{k: v.clone() for k, v in learn.opt.state[p].items()} for p in learn.model.parameters()]


def assert_same_states(got, want):
    for a, b in zip(got, want, strict=True):
        ft.test_eq(sorted(a), sorted(b))
        for k in a: assert torch.equal(a[k], b[k]), k


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
    for states in (peek.seen, opt_state(learn)): assert_same_states(states, before)


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
        # each parameter got its own step count back: one shared tensor would be counted once per parameter
        steps = [learn.opt.state[p]['step'] for p in learn.model.parameters()]
        assert len({id(s) for s in steps}) == len(steps)
        learn.cbs = []
        Runner().fit(1, learn)
        ft.test_eq([float(learn.opt.state[p]['step']) for p in learn.model.parameters()], [3. * len(learn.data.train_dl)] * 6)


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
    ft.test_eq(learn.model[0].weight.detach(), frozen)  # exactly: the masters were copied before rounding to fp16


def test_pieces():
    model = model_to_half(bn_mlp())
    ft.test_eq([p.dtype for p in model.parameters()], [torch.half] * 2 + [torch.float] * 2 + [torch.half] * 2)
    pgs = [list(model.parameters())]
    model(torch.randn(8, 20).half()).float().sum().backward()
    for flat in (False, True):
        masters = get_master(pgs, flat)
        model_grads_to_master(pgs, masters, flat)
        got = masters[0][0].grad if flat else torch.cat([m.grad.reshape(-1) for m in masters[0]])
        ft.test_eq(got, torch.cat([p.grad.float().reshape(-1) for p in pgs[0]]))
        assert not grads_overflow([m for m in masters[0]])
        with torch.no_grad():
            for m in masters[0]: m.mul_(2)
        before = [p.detach().float().clone() for p in pgs[0]]
        master_to_model(pgs, masters, flat)
        for b, p in zip(before, pgs[0]): ft.test_close(p.float(), b * 2, eps=1e-3)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match='dtype must be'): MixedPrecision(dtype=torch.float32)
    with pytest.raises(ValueError, match='max_noskip must be an int >= 1, got 0'): MixedPrecision(max_noskip=0)
    with pytest.raises(ValueError, match='clip must be > 0'): MixedPrecision(clip=0)
    with pytest.raises(ValueError, match='loss_scale <= max_scale'): MixedPrecision(loss_scale=2.**30)


def test_defaults():
    ft.test_eq(MixedPrecision().loss_scale, 2.**16)
    ft.test_eq(MixedPrecision(dynamic=False).loss_scale, 512.)
    mp = MixedPrecision(dtype=torch.bfloat16)
    ft.test_eq((mp.loss_scale, mp.dynamic), (1., False))
    learn = to_fp16(to_fp16(Learner(make_data(), bn_mlp())))
    ft.test_eq(len(learn.cbs), 1)  # a second to_fp16 replaces the first


def test_recorded_loss_is_unscaled():
    losses = []

    class Rec(Callback):
        _order = 150
        def after_batch(self):
            if self.in_train: losses.append(self.loss.item())

    set_seed(0)
    learn = to_fp16(Learner(make_data(), bn_mlp(), lr=0.1))
    Runner(cbs=[Rec()]).fit(1, learn)
    assert max(losses) < 10, losses  # the cross entropy of 4 classes, not 65,536 times it


def train_accuracy(convert, epochs=4, device='cpu'):
    set_seed(0)
    learn = Learner(make_data(), bn_mlp(), lr=0.2, metrics=[accuracy])
    if convert: convert(learn)
    cbs = []
    if device != 'cpu':
        from exp.cnn import DeviceCallback
        cbs.append(DeviceCallback(device))
    run = Runner(cbs=cbs)
    run.fit(epochs, learn)
    return run.avg_stats.valid_stats.avg_stats[1]


def test_fp16_and_bf16_reach_fp32_accuracy(capsys):
    # seed 0, blobs, BN-MLP, lr 0.2, 4 epochs: fp32 reaches about 0.95; mixed precision within 2 points
    acc32 = train_accuracy(None)
    assert acc32 > 0.9
    for convert in (to_fp16, lambda learn: to_fp16(learn, flat_master=True), to_bf16):
        assert abs(train_accuracy(convert) - acc32) <= 0.02


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
    learn = to_fp16(Learner(make_data(), bn_mlp(), lr=0.1), loss_scale=2.**8, max_noskip=2)
    run = Runner(cbs=[DeviceCallback('cuda'), InjectInf(inject), Trace()])
    run.fit(1, learn)
    ft.test_eq(run.trace.scales, gradscaler_scales(len(run.trace.scales), inject, 2.**8, 2, device='cuda'))

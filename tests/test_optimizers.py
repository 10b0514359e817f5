"""Unit tests for exp.optimizers: SGD, Adam and AdamW against torch.optim (bitwise), their state,
their checks, and where they meet the rest of the library (schedulers, the LR finder, mixed
precision, checkpoints).

Every comparison trains two copies of one model side by side, ours and torch's with `foreach=False`
(its loop over the parameters), and asserts that weights and state are bitwise equal: our optimizers
do torch's arithmetic in torch's order. Data-parallel training with our SGD is tested in
test_distributed.py.
"""

import io
from copy import deepcopy
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st
from torch import nn, optim

from exp.anneal import sched_1cycle
from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.data import set_seed
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD, Adam, AdamW

STEPS = 120


def mlp():
    return nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3))


def batches(n=10, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(bs, 20, generator=g), torch.randint(0, 3, (bs,), generator=g))
        for _ in range(n)
    ]


BATCHES = batches()


def train(model, opt, steps=STEPS):
    for i in range(steps):
        xb, yb = BATCHES[i % len(BATCHES)]
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()


def two_groups(model, **first):
    """The first layer with hyperparameters of its own, the last with the defaults; the first bias
    frozen (no grad)."""
    model[0].bias.requires_grad_(False)
    return [
        {'params': list(model[0].parameters()), **first},
        {'params': list(model[2].parameters())},
    ]


def assert_same_run(make_ours, make_theirs, steps=STEPS):
    """Train copies of one model with each optimizer; weights and every state tensor must be bitwise
    equal."""
    set_seed(0)
    theirs_model = mlp()
    ours_model = deepcopy(theirs_model)
    ours, theirs = make_ours(ours_model), make_theirs(theirs_model)
    train(ours_model, ours, steps)
    train(theirs_model, theirs, steps)
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        assert torch.equal(p, q)
        assert sorted(ours.state.get(p, {})) == sorted(theirs.state.get(q, {}))
        for key, value in ours.state.get(p, {}).items():
            assert torch.equal(value, theirs.state[q][key]), key
    return ours_model, ours


# ---------------- against torch.optim, bit for bit

SGD_CASES = {
    'plain': dict(lr=0.1),
    'momentum': dict(lr=0.05, momentum=0.9),
    'dampening and L2': dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-2),
    'nesterov and L2': dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-3),
    'L2 only': dict(lr=0.1, weight_decay=0.1),
}


@pytest.mark.parametrize('kw', SGD_CASES.values(), ids=SGD_CASES.keys())
def test_sgd_equals_torch(kw):
    assert_same_run(
        lambda m: SGD(m.parameters(), **kw),
        lambda m: optim.SGD(m.parameters(), foreach=False, **kw),
    )


@pytest.mark.parametrize('kw', SGD_CASES.values(), ids=SGD_CASES.keys())
def test_sgd_equals_torch_foreach(kw):
    # torch's own foreach implementation (its default on GPUs) gives the same numbers as its loop,
    # and as ours
    assert_same_run(
        lambda m: SGD(m.parameters(), **kw), lambda m: optim.SGD(m.parameters(), foreach=True, **kw)
    )


ADAM_CASES = {
    'adam': (Adam, optim.Adam, dict(lr=3e-3)),
    'adam L2': (Adam, optim.Adam, dict(lr=3e-3, weight_decay=1e-2)),
    'adam betas eps': (Adam, optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6)),
    'adamw default wd': (AdamW, optim.AdamW, dict(lr=3e-3)),
    'adamw wd 0.1': (AdamW, optim.AdamW, dict(lr=3e-3, weight_decay=0.1)),
}


@pytest.mark.parametrize('ours, theirs, kw', ADAM_CASES.values(), ids=ADAM_CASES.keys())
def test_adam_equals_torch(ours, theirs, kw):
    assert_same_run(
        lambda m: ours(m.parameters(), **kw), lambda m: theirs(m.parameters(), foreach=False, **kw)
    )


@pytest.mark.parametrize(
    'ours, theirs, defaults, first',
    [
        (
            SGD,
            optim.SGD,
            dict(lr=0.05, momentum=0.9, nesterov=True),
            dict(lr=0.01, momentum=0.5, weight_decay=1e-3),
        ),
        (Adam, optim.Adam, dict(lr=3e-3), dict(lr=1e-3, betas=(0.8, 0.99), weight_decay=0.1)),
        (AdamW, optim.AdamW, dict(lr=3e-3), dict(lr=1e-2, eps=1e-6, weight_decay=0.0)),
    ],
    ids=['sgd', 'adam', 'adamw'],
)
def test_param_groups_and_a_parameter_without_grad(ours, theirs, defaults, first):
    set_seed(0)
    frozen = mlp()[0].bias.detach().clone()
    model, opt = assert_same_run(
        lambda m: ours(two_groups(m, **first), **defaults),
        lambda m: theirs(two_groups(m, **first), foreach=False, **defaults),
    )
    ft.test_eq(model[0].bias.detach(), frozen)  # never had a gradient: never moved, no state
    assert model[0].bias not in opt.state and model[0].weight in opt.state
    ft.test_eq([g['lr'] for g in opt.param_groups], [first['lr'], defaults['lr']])


def test_parameter_that_gets_a_gradient_only_sometimes():
    # the second layer is used on even steps only: its grad is None on odd ones (zero_grad sets
    # None)
    def run(opt_func):
        set_seed(0)
        model = mlp()
        opt = opt_func(model.parameters())
        for i in range(40):
            xb, yb = BATCHES[i % len(BATCHES)]
            h = model[1](model[0](xb))
            out = model[2](h) if i % 2 == 0 else h[:, :3]
            F.cross_entropy(out, yb).backward()
            opt.step()
            opt.zero_grad()
        return model, opt

    for ours, theirs in [
        (
            partial(SGD, lr=0.05, momentum=0.9),
            partial(optim.SGD, lr=0.05, momentum=0.9, foreach=False),
        ),
        (partial(Adam, lr=3e-3), partial(optim.Adam, lr=3e-3, foreach=False)),
    ]:
        (m1, o1), (m2, o2) = run(ours), run(theirs)
        for p, q in zip(m1.parameters(), m2.parameters()):
            assert torch.equal(p, q)
            for k, v in o1.state[p].items():
                assert torch.equal(v, o2.state[q][k])


def test_a_group_mixing_dtypes():
    # the foreach lists are not split by dtype (nor device): the ops fall back to their loop, with
    # the same numbers in float32 and float64; in float16, foreach ops round some scalar products
    # differently from torch's loop (as torch's own foreach path does), so there the check is to
    # half's precision
    def run(make):
        ps = [
            nn.Parameter(torch.linspace(-1, 1, 5, dtype=dtype))
            for dtype in (torch.float32, torch.float64, torch.float16)
        ]
        opt = make(ps)
        for step in range(5):
            for p in ps:
                p.grad = (torch.arange(5.0) - step + 0.5).to(p.dtype)
            opt.step()
        return ps, opt

    for ours, theirs in [
        (
            partial(SGD, lr=0.1, momentum=0.9, weight_decay=0.1),
            partial(optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1, foreach=False),
        ),
        (partial(AdamW, lr=0.1), partial(optim.AdamW, lr=0.1, foreach=False)),
    ]:
        (ps, o1), (qs, o2) = run(ours), run(theirs)
        for p, q in zip(ps[:2], qs[:2]):
            assert p.dtype == q.dtype and torch.equal(p, q)
            for k, v in o1.state[p].items():
                assert torch.equal(v, o2.state[q][k])
        assert ps[2].dtype == torch.float16
        ft.test_close(ps[2].float(), qs[2].float(), eps=1e-2)


@settings(max_examples=25, deadline=None)
@given(
    lr=st.floats(0, 0.5),
    momentum=st.floats(0, 0.99),
    dampening=st.floats(0, 1),
    weight_decay=st.floats(0, 0.1),
    nesterov=st.booleans(),
)
def test_sgd_equals_torch_for_any_hyperparameters(lr, momentum, dampening, weight_decay, nesterov):
    if nesterov and (momentum == 0 or dampening != 0):
        dampening = 0.0
    if nesterov and momentum == 0:
        momentum = 0.5
    kw = dict(
        lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov
    )
    assert_same_run(
        lambda m: SGD(m.parameters(), **kw),
        lambda m: optim.SGD(m.parameters(), foreach=False, **kw),
        steps=12,
    )


@settings(max_examples=25, deadline=None)
@given(
    lr=st.floats(1e-5, 0.1),
    beta1=st.floats(0, 0.99),
    beta2=st.floats(0, 0.9999),
    eps=st.floats(1e-10, 1e-3),
    weight_decay=st.floats(0, 0.1),
    decoupled=st.booleans(),
)
def test_adam_equals_torch_for_any_hyperparameters(lr, beta1, beta2, eps, weight_decay, decoupled):
    ours, theirs = (AdamW, optim.AdamW) if decoupled else (Adam, optim.Adam)
    kw = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    assert_same_run(
        lambda m: ours(m.parameters(), **kw),
        lambda m: theirs(m.parameters(), foreach=False, **kw),
        steps=12,
    )


def test_state_names_and_signature_defaults():
    w = nn.Parameter(torch.ones(3))
    for opt in (SGD([w], lr=0.1, momentum=0.9), Adam([w]), AdamW([w])):
        w.grad = torch.ones(3)
        opt.step()
    ft.test_eq(
        SGD([w]).defaults,
        dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    )
    ft.test_eq(Adam([w]).defaults, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0))
    ft.test_eq(AdamW([w]).defaults['weight_decay'], 1e-2)
    opt = Adam([w])
    w.grad = torch.ones(3)
    opt.step()
    ft.test_eq(sorted(opt.state[w]), ['exp_avg', 'exp_avg_sq', 'step'])
    ft.test_eq(opt.state[w]['step'], torch.tensor(1.0))


def test_hyperparameters_are_read_at_every_step():
    # a scheduler writes the groups between steps: momentum switched on later starts its buffer
    # then, a new lr and new betas take effect at the next step, as in torch
    for ours, theirs in [(SGD, optim.SGD), (Adam, optim.Adam)]:
        ws = [nn.Parameter(torch.ones(4)) for _ in range(2)]
        opts = [ours([ws[0]], lr=0.1), theirs([ws[1]], lr=0.1, foreach=False)]
        for step in range(6):
            for w, opt in zip(ws, opts):
                w.grad = torch.arange(4.0) - step
                if step == 2:
                    opt.param_groups[0]['lr'] = 0.05
                    opt.param_groups[0].update(momentum=0.9) if ours is SGD else opt.param_groups[
                        0
                    ].update(betas=(0.5, 0.9))
                opt.step()
            assert torch.equal(ws[0], ws[1])


def test_closure_is_called_with_grad_and_its_loss_returned():
    set_seed(0)
    model = mlp()
    xb, yb = BATCHES[0]
    for opt in (SGD(model.parameters(), lr=0.1, momentum=0.9), Adam(model.parameters())):

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            return loss

        with torch.no_grad():
            loss = opt.step(closure)  # the closure gets gradients even so
        assert loss.requires_grad and model[0].weight.grad is not None
    assert SGD(model.parameters(), lr=0.1).step() is None


def test_sparse_gradient_is_refused():
    emb = nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    for opt in (SGD(emb.parameters(), lr=0.1), Adam(emb.parameters())):
        with pytest.raises(RuntimeError, match='does not support sparse gradients'):
            opt.step()


# ---------------- state_dict and checkpoints


@pytest.mark.parametrize(
    'ours, theirs',
    [
        (
            partial(SGD, lr=0.05, momentum=0.9, weight_decay=1e-3),
            partial(optim.SGD, lr=0.05, momentum=0.9, weight_decay=1e-3, foreach=False),
        ),
        (partial(Adam, lr=3e-3), partial(optim.Adam, lr=3e-3, foreach=False)),
        (partial(AdamW, lr=3e-3), partial(optim.AdamW, lr=3e-3, foreach=False)),
    ],
    ids=['sgd', 'adam', 'adamw'],
)
def test_state_dict_round_trip_and_torchs_state(ours, theirs):
    """Half a run, a state_dict through torch.save / torch.load(weights_only=True), the other half:
    the same as one run."""

    def resumed(first_opt, second_opt):
        set_seed(0)
        model = mlp()
        opt = first_opt(model.parameters())
        train(model, opt, STEPS // 2)
        buffer = io.BytesIO()
        torch.save(opt.state_dict(), buffer)
        buffer.seek(0)
        second = second_opt(model.parameters())
        second.load_state_dict(torch.load(buffer, weights_only=True))
        train(model, second, STEPS // 2)
        return model

    set_seed(0)
    straight = mlp()
    train(straight, ours(straight.parameters()))
    # our own state, torch's into ours, and ours into torch's: the state names and layout are the
    # same
    for first, second in ((ours, ours), (theirs, ours), (ours, theirs)):
        for p, q in zip(resumed(first, second).parameters(), straight.parameters()):
            assert torch.equal(p, q)


# ---------------- bad input


@pytest.mark.parametrize(
    'make, error, message',
    [
        (lambda ps: SGD(ps, lr=-0.1), ValueError, r'lr must be >= 0 and finite, got -0.1'),
        (lambda ps: SGD(ps, lr=float('inf')), ValueError, r'lr must be >= 0 and finite, got inf'),
        (lambda ps: SGD(ps, lr=float('nan')), ValueError, r'lr must be >= 0 and finite, got nan'),
        (lambda ps: SGD(ps, lr='0.1'), TypeError, r"lr must be a real number, got '0.1'"),
        (lambda ps: SGD(ps, lr=True), TypeError, r'lr must be a real number, got True'),
        (
            lambda ps: SGD(ps, lr=0.1, momentum=1.0),
            ValueError,
            r'momentum must be in \[0, 1\), got 1.0',
        ),
        (
            lambda ps: SGD(ps, lr=0.1, momentum=-0.1),
            ValueError,
            r'momentum must be in \[0, 1\), got -0.1',
        ),
        (
            lambda ps: SGD(ps, lr=0.1, dampening=1.5),
            ValueError,
            r'dampening must be in \[0, 1\], got 1.5',
        ),
        (
            lambda ps: SGD(ps, lr=0.1, weight_decay=-1e-4),
            ValueError,
            r'weight_decay must be >= 0 and finite, got -0.0001',
        ),
        (
            lambda ps: SGD(ps, lr=0.1, nesterov=True),
            ValueError,
            r'nesterov=True needs momentum > 0 and dampening = 0, got momentum=0.0',
        ),
        (
            lambda ps: SGD(ps, lr=0.1, momentum=0.9, dampening=0.5, nesterov=True),
            ValueError,
            r'nesterov=True needs .* dampening=0.5',
        ),
        (
            lambda ps: SGD(ps, lr=0.1, nesterov=1),
            TypeError,
            r'nesterov must be True or False, got 1',
        ),
        (lambda ps: Adam(ps, lr=-1e-3), ValueError, r'lr must be >= 0'),
        (
            lambda ps: Adam(ps, betas=(1.0, 0.999)),
            ValueError,
            r'betas\[0\] must be in \[0, 1\), got 1.0',
        ),
        (
            lambda ps: Adam(ps, betas=(0.9, 1.0)),
            ValueError,
            r'betas\[1\] must be in \[0, 1\), got 1.0',
        ),
        (
            lambda ps: AdamW(ps, betas=(-0.1, 0.9)),
            ValueError,
            r'betas\[0\] must be in \[0, 1\), got -0.1',
        ),
        (
            lambda ps: Adam(ps, betas=(0.9,)),
            TypeError,
            r'betas must be a pair \(beta1, beta2\), got \(0.9,\)',
        ),
        (lambda ps: Adam(ps, betas='ab'), TypeError, r"betas must be a pair"),
        (lambda ps: Adam(ps, eps=-1e-8), ValueError, r'eps must be >= 0 and finite, got -1e-08'),
        (
            lambda ps: AdamW(ps, weight_decay=-0.01),
            ValueError,
            r'weight_decay must be >= 0 and finite, got -0.01',
        ),
        (
            lambda ps: SGD([{'params': ps[:2]}, {'params': ps[2:], 'lr': -1.0}], lr=0.1),
            ValueError,
            r'param group 1: lr must be >= 0',
        ),
        (
            lambda ps: SGD([{'params': ps[:2], 'momentum': 2.0}], lr=0.1),
            ValueError,
            r'param group 0: momentum must be in \[0, 1\)',
        ),
        (
            lambda ps: Adam([{'params': ps, 'betas': (0.9, 1.5)}]),
            ValueError,
            r'param group 0: betas\[1\] must be in \[0, 1\)',
        ),
        (lambda ps: SGD([], lr=0.1), ValueError, r'empty parameter list'),
    ],
)
def test_bad_input(make, error, message):
    with pytest.raises(error, match=message):
        make(list(mlp().parameters()))


def test_a_bad_group_is_not_added():
    ps = list(mlp().parameters())
    for opt, bad in [
        (SGD(ps[:2], lr=0.1), {'params': ps[2:], 'nesterov': True}),
        (Adam(ps[:2]), {'params': ps[2:], 'eps': -1.0}),
    ]:
        with pytest.raises(ValueError, match='param group 1: '):
            opt.add_param_group(bad)
        assert len(opt.param_groups) == 1
        opt.add_param_group({'params': ps[2:], 'lr': 0.5})
        ft.test_eq(opt.param_groups[1]['lr'], 0.5)


# ---------------- with the rest of the library


def make_data(n_train=64, n_valid=32, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = (
        torch.randn(n_train + n_valid, 20, generator=g),
        torch.randint(0, 3, (n_train + n_valid,), generator=g),
    )
    train_ds, valid_ds = Dataset(x[:n_train], y[:n_train]), Dataset(x[n_train:], y[n_train:])
    return DataBunch(
        DataLoader(train_ds, Sampler(train_ds, bs, shuffle=True, seed=seed)),
        DataLoader(valid_ds, Sampler(valid_ds, bs)),
        c=3,
    )


class Hypers(Callback):
    "The hyperparameters the optimizer steps with, at every training batch."

    _order = 50

    def begin_fit(self):
        self.seen = []

    def after_backward(self):
        if self.in_train:
            self.seen.append({k: v for k, v in self.opt.param_groups[0].items() if k != 'params'})


def test_learner_default_is_our_sgd():
    learn = Learner(make_data(), mlp(), lr=0.2)
    assert type(learn.opt) is SGD and learn.opt.param_groups[0]['lr'] == 0.2


@pytest.mark.parametrize(
    'opt_func, pname, idx, ref',
    [
        (
            partial(SGD, momentum=0.9),
            'momentum',
            None,
            partial(optim.SGD, momentum=0.9, foreach=False),
        ),
        # momentum 0 at first: one-cycle turns it on
        (SGD, 'momentum', None, partial(optim.SGD, foreach=False)),
        (Adam, 'betas', 0, partial(optim.Adam, foreach=False)),
    ],
    ids=['sgd-momentum', 'sgd-plain', 'adam'],
)
def test_one_cycle_schedules_our_optimizers_like_torchs(opt_func, pname, idx, ref):
    runs = []
    for f in (opt_func, ref):
        set_seed(0)
        learn = Learner(make_data(), mlp(), lr=0.05, opt_func=f)
        hypers = Hypers()
        Runner(cbs=[*sched_1cycle(0.05, mom_pname=pname, mom_idx=idx), hypers]).fit(2, learn)
        moms = [h[pname] if idx is None else h[pname][idx] for h in hypers.seen]
        runs.append((learn, moms, [h['lr'] for h in hypers.seen]))
    (ours, moms, lrs), (theirs, ref_moms, ref_lrs) = runs
    ft.test_eq((moms, lrs), (ref_moms, ref_lrs))
    # the schedule reached the optimizer
    ft.test_close((moms[0], min(moms), max(lrs)), (0.95, 0.85, 0.05), eps=0.01)
    if pname == 'momentum':
        assert all('momentum_buffer' in ours.opt.state[p] for p in ours.model.parameters())
    for p, q in zip(ours.model.parameters(), theirs.model.parameters()):
        assert torch.equal(p, q)


# ---------------- what a state dict may hold, and complex weights


@pytest.mark.parametrize(
    'theirs, ours, message',
    [
        (lambda ps: optim.Adam(ps, amsgrad=True), Adam, 'amsgrad=True, which Adam does not do'),
        (lambda ps: optim.Adam(ps, maximize=True), Adam, 'maximize=True, which Adam does not do'),
        (lambda ps: optim.SGD(ps, maximize=True), SGD, 'maximize=True, which SGD does not do'),
        (lambda ps: optim.AdamW(ps), Adam, 'decoupled_weight_decay=True, which Adam does not'),
        (lambda ps: optim.Adam(ps), AdamW, 'decoupled_weight_decay=False, which AdamW does not'),
        (lambda ps: SGD(ps, momentum=0.9), Adam, "no 'betas': the state of another optimizer"),
        (lambda ps: Adam(ps), SGD, "no 'momentum': the state of another optimizer"),
    ],
)
def test_a_state_dict_ours_would_step_wrongly_is_refused(theirs, ours, message):
    "torch's options we do not implement, or another optimizer's state: refused, nothing loaded."
    model = mlp()
    source = theirs(model.parameters())
    for x, y in batches(2):  # states to load, not only hyperparameters
        source.zero_grad()
        F.cross_entropy(model(x), y).backward()
        source.step()
    opt = ours(model.parameters())
    before = deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=message.replace('(', r'\(')):
        opt.load_state_dict(source.state_dict())
    ft.test_eq(opt.state_dict(), before)


def test_a_state_dict_with_bad_values_is_refused():
    model = mlp()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches(1):
        F.cross_entropy(model(x), y).backward()
        opt.step()
    good = opt.state_dict()
    zero_d = deepcopy(good)
    zero_d['state'][0]['momentum_buffer'] = torch.tensor(1.0)
    ft.test_fail(
        lambda: SGD(model.parameters(), lr=0.1, momentum=0.9).load_state_dict(zero_d),
        contains="momentum_buffer of parameter 0 must be a tensor of shape (16, 20)",
    )
    for key, value, message in [
        ('lr', float('nan'), 'lr must be >= 0 and finite, got nan'),
        ('lr', 'fast', "lr must be a real number, got 'fast'"),
        ('momentum', 5, 'momentum must be in [0, 1), got 5'),
    ]:
        bad = deepcopy(good)
        bad['param_groups'][0][key] = value
        ft.test_fail(
            lambda: SGD(model.parameters(), lr=0.1).load_state_dict(bad),
            contains=f"state_dict's param group 0: {message}",
        )
    ft.test_fail(lambda: opt.load_state_dict([1, 2]), contains="must be an optimizer's state")


@pytest.mark.parametrize('ours, theirs', [(Adam, optim.Adam), (AdamW, optim.AdamW)])
def test_complex_weights_step_as_torchs(ours, theirs):
    """A complex weight steps as two real ones, as torch's does: |g|^2 per part, not g*g (which was
    0.036 off after these 20 steps); equal to rounding: torch's complex L2 term rounds a little
    otherwise."""
    w0 = torch.randn(6, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    a, b = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    opt_a = ours([a], lr=0.1, weight_decay=0.1)
    opt_b = theirs([b], lr=0.1, weight_decay=0.1, foreach=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        grad = torch.randn(6, dtype=torch.complex64, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(opt_a.state[a]['exp_avg_sq'], opt_b.state[b]['exp_avg_sq'])

"""Unit tests for exp.hooks: Hook and Hooks, append_stats and ActivationStats, init_cnn,
GeneralRelu (its exercises: test_exercises.py)."""

import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st
from torch import nn

from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.data import set_seed
from exp.hooks import ActivationStats, GeneralRelu, Hook, Hooks, append_stats, init_cnn
from exp.minibatch import DataLoader, Dataset, Sampler

matplotlib.use('Agg')


def make_data(n=256, bs=32):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 20, generator=g), torch.randint(0, 4, (n,), generator=g)
    train, valid = Dataset(x[:192], y[:192]), Dataset(x[192:], y[192:])
    return DataBunch(
        DataLoader(train, Sampler(train, bs, shuffle=True, seed=1)),
        DataLoader(valid, Sampler(valid, bs)),
        c=4,
    )


def mlp():
    return nn.Sequential(
        nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )


def n_hooks(model):
    return sum(len(m._forward_hooks) for m in model.modules())


# ---------------- Hook, Hooks


def test_hook_calls_func_with_hook_module_input_output_and_is_removed():
    layer, calls = nn.Linear(3, 2), []

    def record(hook, module, inp, out):
        calls.append((hook, module, inp[0].shape, out.shape))

    with Hook(layer, record) as hook:
        layer(torch.randn(5, 3))
        ft.test_eq(len(layer._forward_hooks), 1)
    layer(torch.randn(4, 3))  # after the with block: no call
    ft.test_eq(calls, [(hook, layer, torch.Size([5, 3]), torch.Size([5, 2]))])
    ft.test_eq(len(layer._forward_hooks), 0)
    hook.remove()  # a second remove is harmless


def test_hook_does_not_change_the_output():
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    with torch.no_grad(), Hook(layer, lambda *args: None):
        ft.test_eq(layer(x), F.linear(x, layer.weight, layer.bias))


def test_hooks_are_removed_when_the_block_fails():
    model = mlp()
    with pytest.raises(RuntimeError, match='inside'):
        with Hooks(model, lambda *args: None) as hooks:
            ft.test_eq(len(hooks), 5)
            raise RuntimeError('inside')
    ft.test_eq(n_hooks(model), 0)


def test_hooks_container():
    model = mlp()
    relus = [m for m in model if isinstance(m, nn.ReLU)]
    hooks = Hooks(relus, lambda *args: None)
    ft.test_eq(len(hooks), 2)
    ft.test_eq([h.module for h in hooks], relus)
    assert hooks[1].module is relus[1]
    assert 'ReLU' in repr(hooks)
    hooks.remove()
    ft.test_eq(n_hooks(model), 0)
    # any iterable
    with Hooks(model.children(), lambda *args: None) as hooks:
        ft.test_eq(len(hooks), 5)


def test_hook_arguments_are_checked():
    with pytest.raises(TypeError, match='module must be an nn.Module, got function'):
        Hook(lambda x: x, print)
    with pytest.raises(TypeError, match="func must be callable, got 'f'"):
        Hook(nn.ReLU(), 'f')
    with pytest.raises(TypeError, match='use Hook for a single module'):
        Hooks(nn.ReLU(), print)
    relu = nn.ReLU()
    with pytest.raises(TypeError, match='module must be an nn.Module, got int'):
        Hooks([relu, 3], print)
    ft.test_eq(len(relu._forward_hooks), 0)  # the hook already on relu was taken off


# ---------------- append_stats


def test_append_stats_records_mean_std_histogram_in_training_only():
    relu = nn.ReLU()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 3
    with Hook(relu, append_stats) as hook:
        relu(x)
        relu.eval()
        relu(x)
        relu.train()
        relu(x * 2)
    means, stds, hists = hook.stats
    ft.test_eq(len(means), 2)
    for i, xi in enumerate((x, x * 2)):
        out = xi.relu()
        ft.test_eq(means[i], out.mean())
        ft.test_eq(stds[i], out.std())
        ft.test_eq(hists[i], out.abs().histc(40, 0, 10))
    ft.test_eq(hook.counts, [512, 512])


def test_append_stats_never_synchronises(monkeypatch):
    # a hook that called .item(), float(), bool() or .tolist() on a CUDA tensor would make the GPU
    # wait every batch
    def refuse(*args, **kwargs):
        raise AssertionError('append_stats read a tensor value on the host')

    relu = nn.ReLU()
    with Hook(relu, append_stats) as hook:
        for name in ('item', 'tolist', '__float__', '__bool__', '__int__'):
            monkeypatch.setattr(torch.Tensor, name, refuse)
        relu(torch.randn(16, 4))
        monkeypatch.undo()
    assert all(isinstance(t, torch.Tensor) for t in hook.stats[0] + hook.stats[1] + hook.stats[2])


# ---------------- ActivationStats


def fit_with(stats, epochs=2, model=None, cbs=()):
    set_seed(0)
    model = model or mlp()
    learn = Learner(make_data(), model, lr=0.1)
    Runner(cbs=[stats, *cbs]).fit(epochs, learn)
    return model


def test_activation_stats_shapes_and_values():
    stats = ActivationStats(nn.ReLU)
    model = fit_with(stats)
    # 2 ReLUs, 6 training batches x 2 epochs: validation not recorded
    ft.test_eq(stats.means.shape, (2, 12))
    ft.test_eq(stats.hists.shape, (2, 12, 40))
    ft.test_eq(stats.names, ['1 ReLU', '3 ReLU'])
    ft.test_eq(n_hooks(model), 0)
    assert (stats.stds > 0).all() and (stats.hists.sum(-1) <= 32 * 16).all()
    near = stats.near_zero
    assert ((near >= 0) & (near <= 1)).all()


def test_activation_stats_equal_a_direct_computation():
    seen = []

    class Grab(Callback):
        _order = 1

        def after_pred(self):
            # the first block's output, computed without the model (which would fire the hooks
            # again)
            if self.in_train:
                seen.append(
                    F.linear(self.xb, self.model[0].weight, self.model[0].bias).relu().detach()
                )

    stats = ActivationStats()  # default: the model's children
    fit_with(stats, epochs=1, cbs=[Grab()])
    ft.test_eq(len(stats.names), 5)
    for i, out in enumerate(seen):
        ft.test_close(stats.means[1, i], out.mean(), eps=1e-6)
        ft.test_close(stats.stds[1, i], out.std(), eps=1e-6)
        ft.test_close(stats.near_zero[1, i], (out.abs() < 0.25).float().mean(), eps=1e-6)


def test_activation_stats_choice_of_modules():
    model = mlp()
    linears = [model[0], model[4]]
    stats = ActivationStats(linears)
    fit_with(stats, epochs=1, model=model)
    ft.test_eq(stats.names, ['0 Linear', '4 Linear'])
    stats = ActivationStats((nn.ReLU, nn.Linear), bins=10, max_abs=2.0)
    fit_with(stats, epochs=1)
    ft.test_eq(stats.hists.shape, (5, 6, 10))


def test_activation_stats_remove_hooks_after_an_error_and_refit_afresh():
    class Boom(Callback):
        def after_batch(self):
            if self.n_iter == 2:
                raise RuntimeError('boom')

    stats, model = ActivationStats(nn.ReLU), mlp()
    with pytest.raises(RuntimeError, match='boom'):
        fit_with(stats, model=model, cbs=[Boom()])
    ft.test_eq(n_hooks(model), 0)
    ft.test_eq(stats.means.shape, (2, 2))
    fit_with(stats, epochs=1, model=model)
    ft.test_eq(stats.means.shape, (2, 6))  # the second fit records afresh
    ft.test_eq(n_hooks(model), 0)


def test_activation_stats_arguments_are_checked():
    with pytest.raises(TypeError, match='modules must be None, an nn.Module class'):
        ActivationStats('relu')
    with pytest.raises(TypeError, match='modules must be None'):
        ActivationStats([nn.ReLU(), 1])
    with pytest.raises(TypeError, match='modules must be None'):
        ActivationStats((nn.ReLU, int))
    with pytest.raises(ValueError, match='bins must be a positive int, got 0'):
        ActivationStats(bins=0)
    with pytest.raises(ValueError, match='bins must be a positive int'):
        ActivationStats(bins=True)
    with pytest.raises(ValueError, match='max_abs must be a finite number > 0, got -1'):
        ActivationStats(max_abs=-1)
    with pytest.raises(ValueError, match='fit with this callback first'):
        ActivationStats().stds
    stats = ActivationStats()
    fit_with(stats, epochs=0)  # a fit without a training batch
    with pytest.raises(ValueError, match='fit with this callback first'):
        stats.means
    model = mlp()
    with pytest.raises(ValueError, match='found no modules to hook'):
        fit_with(ActivationStats(nn.Conv2d), model=model)
    ft.test_eq(n_hooks(model), 0)
    stranger = nn.ReLU()  # not in the model: its statistics would stay empty, fit after fit
    with pytest.raises(ValueError, match='not in the model being fitted: ReLU'):
        fit_with(ActivationStats([model[0], stranger]), model=model)
    ft.test_eq(n_hooks(model) + n_hooks(stranger), 0)


def test_activation_stats_plots():
    stats = ActivationStats(nn.ReLU)
    fit_with(stats, epochs=1)
    ft.test_eq(len(stats.plot_stats().axes), 2)
    ft.test_eq(len(stats.plot_near_zero().axes), 1)
    fig = stats.color_dim(cols=1)
    ft.test_eq(len(fig.axes), 2)
    ft.test_eq(fig.axes[0].images[0].get_array().shape, (40, 6))  # bins x batches
    matplotlib.pyplot.close('all')


# ---------------- init_cnn, GeneralRelu


@pytest.mark.parametrize('leak', [0.0, 0.1, 1.0])
def test_init_cnn_is_he_normal(leak):
    set_seed(0)
    model = init_cnn(
        nn.Sequential(nn.Conv2d(32, 64, 3), nn.Linear(500, 300), nn.Conv1d(8, 8, 5, bias=False)),
        leak=leak,
    )
    for m, fan_in in zip(model, (32 * 9, 500, 40)):
        ft.test_close(
            m.weight.std().item(),
            math.sqrt(2 / ((1 + leak**2) * fan_in)),
            eps=0.03 * math.sqrt(2 / fan_in),
        )
        if m.bias is not None:
            ft.test_eq(m.bias.abs().max().item(), 0.0)
    with pytest.raises(ValueError, match='leak must be a number >= 0, got -0.1'):
        init_cnn(model, leak=-0.1)


def test_init_cnn_keeps_the_std_through_20_relu_layers():
    # seed 0, width 256, batch 512: the pre-activation std stays in [0.7, 1.4]; with PyTorch's
    # default it ends below 1e-6
    set_seed(0)
    model = init_cnn(
        nn.Sequential(*[m for _ in range(20) for m in (nn.Linear(256, 256), nn.ReLU())])
    )
    x, stds = torch.randn(512, 256).relu(), []
    for m in model:
        x = m(x)
        if isinstance(m, nn.Linear):
            stds.append(x.std().item())
    assert all(0.7 < s < 1.4 for s in stds), stds
    default = nn.Sequential(
        *[m for _ in range(20) for m in (nn.Linear(256, 256, bias=False), nn.ReLU())]
    )
    assert default(torch.randn(512, 256)).std() < 1e-6


@settings(max_examples=50, deadline=None)
@given(
    leak=st.one_of(st.none(), st.floats(0, 1)),
    sub=st.one_of(st.none(), st.floats(-1, 1)),
    maxv=st.one_of(st.none(), st.floats(0.5, 10)),
)
def test_general_relu_matches_torch_ops(leak, sub, maxv):
    x = torch.randn(200, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 5
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = GeneralRelu(leak, sub, maxv)(x1)
    ref = F.leaky_relu(x2, leak) if leak is not None else F.relu(x2)
    if sub is not None:
        ref = ref - sub
    if maxv is not None:
        ref = ref.clamp_max(maxv)
    ft.test_eq(ours.detach(), ref.detach())
    ours.sum().backward()
    ref.sum().backward()
    ft.test_eq(x1.grad, x2.grad)


def test_general_relu_arguments():
    with pytest.raises(ValueError, match='leak must be >= 0 or None, got -0.1'):
        GeneralRelu(leak=-0.1)
    with pytest.raises(ValueError, match="sub must be a finite number or None, got 'a'"):
        GeneralRelu(sub='a')
    with pytest.raises(ValueError, match='maxv must be a finite number or None, got nan'):
        GeneralRelu(maxv=float('nan'))
    assert 'leak=0.1, sub=0.4, maxv=6.0' in repr(GeneralRelu(0.1, 0.4, 6.0))

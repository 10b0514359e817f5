"""Our SGD with momentum 0.9 against optim.SGD's default (on the CPU, torch's loop over the
parameters; on a GPU, its foreach version): one training step (forward, loss, backward, step,
zero_grad) of the lesson's MLP (784-50-10, bs 64) and of the lesson's CNN (conv 1-8-16-32-32, bs
512), and the optimizer step alone. Target: each training step within 1.2x of torch's."""

import torch
import torch.nn.functional as F
from torch import nn, optim

from common import fashion_or_random, median_times, report
from exp.callbacks import DataBunch
from exp.cnn import get_cnn_model
from exp.optimizers import SGD

x, y, _, _, data_name = fashion_or_random()
lr, momentum = 0.01, 0.9
OPT_STEPS = 200  # optimizer steps alone, per timing


def mlp():
    return nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))


def cnn():
    return get_cnn_model(DataBunch(None, None, c=10))


def contenders(make_model, bs, steps):
    """For ours and torch's SGD: `steps` training steps on a model of its own, and OPT_STEPS
    optimizer steps alone."""
    batches = [(x[i : i + bs], y[i : i + bs]) for i in range(0, bs * 8, bs)]
    if make_model is cnn:
        batches = [(xb.view(-1, 1, 28, 28), yb) for xb, yb in batches]
    out = []
    for opt_func in (SGD, optim.SGD):
        torch.manual_seed(0)
        model = make_model()
        opt = opt_func(model.parameters(), lr=lr, momentum=momentum)

        def train(model=model, opt=opt):
            for i in range(steps):
                xb, yb = batches[i % len(batches)]
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
                opt.zero_grad()

        def step_only(model=model, opt=opt):
            for p in model.parameters():
                p.grad = torch.full_like(p, 1e-3)
            for _ in range(OPT_STEPS):
                opt.step()

        out.append((train, step_only))
    return out


report('data', data_name)
report('torch_threads', torch.get_num_threads())
for name, make_model, bs, steps in (('mlp', mlp, 64, 100), ('cnn', cnn, 512, 4)):
    (ours_train, ours_step), (torch_train, torch_step) = contenders(make_model, bs, steps)
    t_ours, t_torch = median_times(ours_train, torch_train, repeats=11)
    report(f'{name}_train_step_ours_us', t_ours / steps * 1e6, '.1f')
    report(f'{name}_train_step_torch_us', t_torch / steps * 1e6, '.1f')
    report(f'{name}_train_step_ratio', t_ours / t_torch, '.3f')
    s_ours, s_torch = median_times(ours_step, torch_step, repeats=11)
    report(f'{name}_opt_step_ours_us', s_ours / OPT_STEPS * 1e6, '.1f')
    report(f'{name}_opt_step_torch_us', s_torch / OPT_STEPS * 1e6, '.1f')
    report(f'{name}_opt_step_ratio', s_ours / s_torch, '.3f')

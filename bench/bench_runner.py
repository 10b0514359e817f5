"""One epoch of `Runner().fit` (default callbacks) against the same loop written by hand: same
model, data and batches (MLP 784-50-10, bs 64, 20,000 training samples, validation on the test
split). Target: ratio at most 1.05. Also times the bare event dispatch per batch, and what the
Learner's check for a non-finite loss (TerminateOnNaNCallback) adds to each batch."""

import time

import torch
import torch.nn.functional as F
from torch import nn

from common import fashion_or_random, median_times, report
from exp.callbacks import DataBunch, Learner, Runner
from exp.learner import TerminateOnNaNCallback
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD

x, y, xv, yv, data_name = fashion_or_random()
x, y = x[:20000], y[:20000]
bs, lr = 64, 0.1
train_ds, valid_ds = Dataset(x, y), Dataset(xv, yv)


def loaders():
    "Fresh loaders with the same seed: both contenders see exactly the same batches."
    return DataLoader(train_ds, Sampler(train_ds, bs, shuffle=True, seed=0)), DataLoader(
        valid_ds, Sampler(valid_ds, bs * 2)
    )


def new_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))


def with_runner(cbs=()):
    Runner(cbs=list(cbs)).fit(
        1, Learner(DataBunch(*loaders(), c=10), new_model(), F.cross_entropy, SGD, lr=lr)
    )


def with_runner_and_nan_check():
    with_runner([TerminateOnNaNCallback()])


def by_hand():
    model = new_model()
    opt = SGD(model.parameters(), lr=lr)
    train_dl, valid_dl = loaders()
    model.train()
    for xb, yb in train_dl:
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        for xb, yb in valid_dl:
            F.cross_entropy(model(xb), yb)


report('data', f'{data_name}, first 20000')
report('torch_threads', torch.get_num_threads())
t_run, t_check, t_hand = median_times(with_runner, with_runner_and_nan_check, by_hand, repeats=11)
report('runner_epoch_s', t_run)
report('hand_written_epoch_s', t_hand)
report('runner_vs_hand_ratio', t_run / t_hand, '.3f')
report('runner_with_nan_check_vs_hand_ratio', t_check / t_hand, '.3f')

# the dispatch alone: six events per training batch through the handler table, no model
run = Runner()
run._build_table()
run.in_train, run.iters = False, 1
events = ('begin_batch', 'after_pred', 'after_loss', 'after_backward', 'after_step', 'after_batch')
n = 100_000
t0 = time.perf_counter()
for _ in range(n):
    for e in events:
        run(e)
report('dispatch_us_per_batch', (time.perf_counter() - t0) / n * 1e6, '.2f')

# the non-finite-loss check alone, on the CPU: its after_loss handler on a training batch's loss
check = Runner(cbs=[TerminateOnNaNCallback()])
check.learn = Learner(DataBunch(*loaders(), c=10), new_model(), F.cross_entropy, SGD, lr=lr)
check.in_train, check.loss = True, F.cross_entropy(new_model()(x[:bs]), y[:bs])
cb = check.terminate_on_nan
cb.begin_fit()
cb.begin_epoch()
t0 = time.perf_counter()
for _ in range(n):
    cb.after_loss()
report('nan_check_us_per_batch', (time.perf_counter() - t0) / n * 1e6, '.2f')

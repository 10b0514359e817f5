"""`fit` against the same training written by hand (same model, optimizer, shuffled batches and
weighted validation), one epoch of an MLP 784-50-10 at bs 64. Target: fit within 1.1x."""

import torch
import torch.nn.functional as F
from torch import nn

from common import fashion_or_random, median_times, report
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler, fit
from exp.optimizers import SGD

x, y, xv, yv, data_name = fashion_or_random()
bs, lr = 64, 0.1


def setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))
    return model, SGD(model.parameters(), lr=lr)


def by_hand():
    model, opt = setup()
    model.train()
    for idxs in torch.randperm(len(x)).split(bs):
        loss = F.cross_entropy(model(x[idxs]), y[idxs])
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    total_loss = total_acc = 0.0
    with torch.no_grad():
        for i in range(0, len(xv), bs * 2):
            xb, yb = xv[i : i + bs * 2], yv[i : i + bs * 2]
            pred = model(xb)
            total_loss += F.cross_entropy(pred, yb).item() * len(xb)
            total_acc += accuracy(pred, yb).item() * len(xb)
    return total_loss / len(xv), total_acc / len(xv)


train_dl = DataLoader(Dataset(x, y), Sampler(range(len(x)), bs, shuffle=True, seed=0))
valid_dl = DataLoader(Dataset(xv, yv), Sampler(range(len(xv)), bs * 2))


def with_fit():
    model, opt = setup()
    return fit(1, model, F.cross_entropy, opt, train_dl, valid_dl, verbose=False)


report('data', data_name)
report('torch_threads', torch.get_num_threads())
t_fit, t_hand = median_times(with_fit, by_hand)
report('fit_epoch_s', t_fit)
report('hand_written_epoch_s', t_hand)
report('fit_vs_hand_ratio', t_fit / t_hand, '.3f')

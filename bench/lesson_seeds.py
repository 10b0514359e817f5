"""The seed sweeps that lessons 03 and 03b quote: each lesson's training run over several seeds,
with the exported modules.

- 03, the embedded digits: the MLP 784-50-10, `exp.minibatch`'s `Optimizer` (plain SGD) at lr 0.2
  (the lesson's) and 0.5, bs 64, five epochs; `set_seed(seed)`, then `get_dls`, then the model, as
  the lesson's "run again" cell does.
- 03, Fashion-MNIST: the same MLP and loop on the full data set at lr 0.5 and 0.1, three epochs, as
  the lesson's Fashion-MNIST cell.
- 03b, the embedded digits: the same MLP, bs 64, five epochs, with `exp.optimizers`' `SGD` (plain at
  lr 0.1, momentum 0.9 at lr 0.1, 0.01 and 0.03) and `Adam` at lr 3e-3; `set_seed(seed)`, then the
  model, then `get_dls`, as the lesson's `train` does.

Each row: the last epoch's validation accuracy for every seed, then its min / mean / max (to three
digits, as the lessons quote them).

Usage: OMP_NUM_THREADS=1 python bench/lesson_seeds.py [--seeds 10]
    [--sweeps digits fashion optimizers]
"""

import argparse
import time

import torch.nn.functional as F
from torch import nn

from exp.data import get_data, normalize, set_seed
from exp.minibatch import Dataset, Optimizer, fit, get_dls
from exp.optimizers import SGD, Adam

SWEEPS = ('digits', 'fashion', 'optimizers')

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument('--seeds', type=int, default=10, help='seeds 0 to SEEDS - 1')
parser.add_argument('--sweeps', nargs='+', choices=SWEEPS, default=list(SWEEPS))
args = parser.parse_args()


def datasets(name: str) -> tuple[Dataset, Dataset]:
    "The lessons' data: normalised with the training set's mean and standard deviation."
    set_seed(42)  # as the lessons, before get_data
    x_train, y_train, x_valid, y_valid = get_data(name)
    mean, std = x_train.mean(), x_train.std()
    return (
        Dataset(normalize(x_train, mean, std), y_train),
        Dataset(normalize(x_valid, mean, std), y_valid),
    )


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))


def lesson03(train_ds, valid_ds, lr, epochs, seed):
    "03's cells: the loaders first, then the model and its Optimizer."
    set_seed(seed)
    train_dl, valid_dl = get_dls(train_ds, valid_ds, 64)
    model = mlp()
    opt = Optimizer(model.parameters(), lr)
    return fit(epochs, model, F.cross_entropy, opt, train_dl, valid_dl, verbose=False)[1]


def lesson03b(train_ds, valid_ds, make_opt, seed, epochs=5):
    "03b's `train`: the model first, then the loaders."
    set_seed(seed)
    model = mlp()
    train_dl, valid_dl = get_dls(train_ds, valid_ds, 64)
    opt = make_opt(model.parameters())
    return fit(epochs, model, F.cross_entropy, opt, train_dl, valid_dl, verbose=False)[1]


def row(name, run):
    "Run `run(seed)` for every seed; print the accuracies and their min / mean / max."
    start = time.perf_counter()
    accs = [run(seed) for seed in range(args.seeds)]
    print(
        f'{name:48s} {" ".join(f"{a:.4f}" for a in accs)}  min / mean / max '
        f'{min(accs):.3f} / {sum(accs) / len(accs):.3f} / {max(accs):.3f}  '
        f'({time.perf_counter() - start:.0f} s)',
        flush=True,
    )


print(f'valid accuracy of the last epoch, seeds 0-{args.seeds - 1}')
if 'digits' in args.sweeps or 'optimizers' in args.sweeps:
    digits = datasets('mnist5k')
if 'digits' in args.sweeps:
    for lr in (0.2, 0.5):
        row(f'03 digits, Optimizer lr {lr}, 5 epochs', lambda s: lesson03(*digits, lr, 5, s))
if 'fashion' in args.sweeps:
    fashion = datasets('fashion')
    for lr in (0.5, 0.1):
        row(f'03 fashion, Optimizer lr {lr}, 3 epochs', lambda s: lesson03(*fashion, lr, 3, s))
if 'optimizers' in args.sweeps:
    settings = {
        'SGD lr 0.1': lambda ps: SGD(ps, lr=0.1),
        'SGD momentum 0.9, lr 0.1': lambda ps: SGD(ps, lr=0.1, momentum=0.9),
        'SGD momentum 0.9, lr 0.01': lambda ps: SGD(ps, lr=0.01, momentum=0.9),
        'SGD momentum 0.9, lr 0.03': lambda ps: SGD(ps, lr=0.03, momentum=0.9),
        'Adam lr 3e-3': lambda ps: Adam(ps, lr=3e-3),
    }
    for name, make_opt in settings.items():
        row(f'03b digits, {name}, 5 epochs', lambda s: lesson03b(*digits, make_opt, s))

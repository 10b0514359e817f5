"""A small training run for tests/test_distributed.py: data-parallel when torchrun (or the test) gives it a
process group's environment, else one process reading the same global batches.

Usage: python tests/dist_worker.py OUT [--fp16] [--die-at EPOCH] [--stall] [--timeout SECONDS]
Writes OUT/rank<r>.json (each epoch's statistics, and the loss scale) and, from rank 0, OUT/model.pth.
--die-at: rank 1 exits with an error at the start of that epoch. --stall: rank 1 joins the group, then
sleeps instead of training.
"""
import argparse
import json
import time
from functools import partial

from torch import nn

from exp.callbacks import Callback, DataBunch, Learner
from exp.data import get_data, normalize, set_seed
from exp.distributed import ShardedSampler, shutdown, torchrun_env
from exp.learner import SaveModelCallback
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler, get_dls
from exp.optimizers import SGD

GLOBAL_BS, SEED = 48, 11

parser = argparse.ArgumentParser()
parser.add_argument('out')
parser.add_argument('--fp16', action='store_true')
parser.add_argument('--die-at', type=int, default=None)
parser.add_argument('--stall', action='store_true')
parser.add_argument('--timeout', type=float, default=60)
args = parser.parse_args()


class SetEpoch(Callback):
    "The single-process run's stand-in for DistributedCallback's `set_epoch`."
    def begin_epoch(self):
        sampler = getattr(self.data.train_dl, 'sampler', None)  # learn.validate() fits with no training loader
        if sampler is not None: sampler.set_epoch(self.epoch)


class Die(Callback):
    def begin_epoch(self):
        if self.epoch == args.die_at and self.learn.rank == 1: raise SystemExit('rank 1: dying on purpose')


set_seed(0)
model = nn.Sequential(nn.Linear(784, 40), nn.ReLU(), nn.Linear(40, 10))
x, y, xv, yv = get_data('mnist5k')
mean, std = x.mean(), x.std()
# 600 = 12.5 global batches: the last one is partial; 199 validation samples: the shards differ in length
train_ds = Dataset(normalize(x[:600], mean, std), y[:600])
valid_ds = Dataset(normalize(xv[:199], mean, std), yv[:199])
distributed = torchrun_env() is not None
if distributed: data, cbs = DataBunch(*get_dls(train_ds, valid_ds, GLOBAL_BS), c=10), [Die()]
else:
    data = DataBunch(DataLoader(train_ds, ShardedSampler(train_ds, GLOBAL_BS, 1, 0, seed=SEED)),
                     DataLoader(valid_ds, Sampler(valid_ds, 64)), c=10)
    cbs = [SetEpoch()]
learn = Learner(data, model, lr=0.1, opt_func=partial(SGD, momentum=0.9), metrics=[accuracy], cbs=cbs)
learn.display = 'off'
if args.fp16: learn.to_fp16()
if distributed:
    learn.to_distributed(seed=SEED, timeout=args.timeout)
    if args.stall and learn.rank == 1: time.sleep(600)
learn.fit_one_cycle(3, cbs=[SaveModelCallback(f'{args.out}/model.pth')])
mp = getattr(learn.run, 'mixed_precision', None)
result = {'history': [{k: v for k, v in row.items() if k != 'time'} for row in learn.run.avg_stats.history],
          'loss_scale': mp.loss_scale if mp else None, 'skipped': mp.skipped if mp else None,
          'world_size': learn.world_size, 'validate': learn.validate()}
with open(f'{args.out}/rank{learn.rank}.json', 'w') as f: json.dump(result, f)
shutdown()

"""A small training run for tests/test_distributed.py: data-parallel when torchrun (or the test)
gives it a process group's environment, else the same options in one process.

Usage: python tests/dist_worker.py OUT [--fp16] [--die-at EPOCH] [--fault raise|kill|hang --at
batch|broadcast|validation]
       [--timeout SECONDS]
Writes OUT/rank<r>.json (each epoch's statistics, and the loss scale) and, from rank 0,
OUT/model.pth.
--die-at: rank 1 exits with an error at the start of that epoch. --fault: rank 1 raises, SIGKILLs
itself or hangs, at the weight broadcast (before the fit), in the middle of a training batch of
epoch 1 (after its forward, before the gradient all-reduce), or in epoch 1's validation (so that
rank 0 waits for it in the statistics' all-reduce).
"""

import argparse
import json
import os
import signal
import time
from functools import partial

from torch import nn

from exp.callbacks import Callback, DataBunch, Learner
from exp.data import get_data, normalize, set_seed
from exp.distributed import shutdown, torchrun_env
from exp.learner import SaveModelCallback
from exp.loss import accuracy
from exp.minibatch import Dataset, get_dls
from exp.optimizers import SGD

GLOBAL_BS = 48

parser = argparse.ArgumentParser()
parser.add_argument('out')
parser.add_argument('--fp16', action='store_true')
parser.add_argument('--die-at', type=int, default=None)
parser.add_argument('--fault', choices=('raise', 'kill', 'hang'))
parser.add_argument('--at', choices=('batch', 'broadcast', 'validation'), default='batch')
parser.add_argument('--timeout', type=float, default=60)
args = parser.parse_args()


def fault():
    "Rank 1's fault, as --fault says."
    print('rank 1: fault now', flush=True)
    if args.fault == 'raise':
        raise RuntimeError('rank 1: failing on purpose')
    if args.fault == 'kill':
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


class Faults(Callback):
    def begin_epoch(self):
        if self.epoch == args.die_at and self.learn.rank == 1:
            raise SystemExit('rank 1: dying on purpose')
        self.batch = 0

    # in the middle of a training batch: the forward done, the backward's all-reduce to come
    def after_pred(self):
        if (
            self.run.in_train
            and self.learn.rank == 1
            and args.fault
            and args.at == 'batch'
            and self.epoch == 1
        ):
            self.batch += 1
            if self.batch == 3:
                fault()

    def begin_validate(self):
        if self.learn.rank == 1 and args.fault and args.at == 'validation' and self.epoch == 1:
            fault()


set_seed(0)
model = nn.Sequential(nn.Linear(784, 40), nn.ReLU(), nn.Linear(40, 10))
x, y, xv, yv = get_data('mnist5k')
mean, std = x.mean(), x.std()
# 599 = 12 global batches of 48 and one of 23, which two processes share 12 + 11 (their gradients
# weighed so); 199 validation samples: the shards differ in length
train_ds = Dataset(normalize(x[:599], mean, std), y[:599])
valid_ds = Dataset(normalize(xv[:199], mean, std), yv[:199])
distributed = torchrun_env() is not None
# the same loaders, one process or several
data = DataBunch(*get_dls(train_ds, valid_ds, GLOBAL_BS), c=10)
learn = Learner(
    data, model, lr=0.1, opt_func=partial(SGD, momentum=0.9), metrics=[accuracy], cbs=[Faults()]
)
learn.display = 'off'
if args.fp16:
    learn.to_fp16()
if distributed:
    learn.to_distributed(timeout=args.timeout)
    if args.fault and args.at == 'broadcast' and learn.rank == 1:
        fault()
learn.fit_one_cycle(3, cbs=[SaveModelCallback(f'{args.out}/model.pth')])
mp = getattr(learn.run, 'mixed_precision', None)
result = {
    'history': [
        {k: v for k, v in row.items() if k != 'time'} for row in learn.run.avg_stats.history
    ],
    'loss_scale': mp.loss_scale if mp else None,
    'skipped': mp.skipped if mp else None,
    'world_size': learn.world_size,
    'validate': learn.validate(),
}
with open(f'{args.out}/rank{learn.rank}.json', 'w') as f:
    json.dump(result, f)
shutdown()

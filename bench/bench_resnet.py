"""An epoch of the ResNet of notebook 13 (`resnet()`, course22p2's model of 1.2M parameters) with
our Learner against a loop written by hand that does the same work, on Fashion-MNIST (random data
of its shape where it is not installed). Goal: ours within 1.02x of the hand loop.

The same work means: the same model and weights at the start (`resnet()` seeded), the same batches
(the same Sampler and seed), AdamW at a constant lr of 1e-2 with weight decay 1e-2, the loss and
accuracy summed over the training and the validation batches, as the Learner's table shows them.
Before timing, the script checks that both end with bit-identical weights and statistics.

By default each contender trains on the first `--batches` training batches of bs 256 (and
validates on the first `--valid-batches` batches of bs 512), not the whole epoch: an epoch of 235
batches takes a minute or more on a laptop's CPU, for each contender, in each round. `--batches 0`
trains on the whole training set. Ours and the hand loop alternate, `--rounds` rounds, in one
process; each line gives the median over the rounds of the ratio ours / hand and its spread
(min-max). The clock is the process's CPU time (all threads), which another process on the machine
disturbs less than the wall clock.

Where fastai is installed (the `[peers]` extra), its Learner trains the same model (`resnet()`,
seeded alike) on the same tensors, as its documentation has it (its DataLoaders over the
datasets, its Adam with decoupled weight decay `wd`, `fit(1, lr)`, no bar, no logging), timed in
the same rounds: `fastai_ratio` is its time over the hand loop's. Its batches are its own shuffle,
so its run is not checked against ours bit for bit.

With --channels-last both contenders run again with the model and every batch in channels_last
memory format (ours through a batch transform), against the same hand loop in channels_last:
`channels_last_ratio` is ours / hand there, `channels_last_speedup` the hand loop's time in the
default format over its time in channels_last.

With --compile both contenders train one model compiled by `torch.compile` (inductor, its
default), kept from round to round so that it compiles once, in the warm-up run (`compile_s`):
`compiled_ratio` is ours / hand with it, `compile_speedup` the hand loop's time eager over its
time compiled. Compiled kernels round differently, so these runs are not checked bit for bit.

    python bench/bench_resnet.py [--batches 20] [--valid-batches 2] [--rounds 3] [--bs 256]
                                 [--threads 1] [--channels-last] [--compile]
"""

import argparse
import contextlib
import io
import statistics
import sys
import time

import torch

import torch.nn.functional as F

from common import fashion_or_random, report
from exp.callbacks import DataBunch
from exp.learner import Learner  # with notebook 10's fit
from exp.cnn import BatchTransformXCallback
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import AdamW
from exp.recipes import to_channels_last
from exp.resnet import resnet

LR, WD = 1e-2, 1e-2
CLOCK = time.process_time


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog='bench_resnet.py',
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        '--batches', type=int, default=20, help='training batches (0: the whole training set)'
    )
    ap.add_argument('--valid-batches', type=int, default=2, help='validation batches (0: all)')
    ap.add_argument('--rounds', type=int, default=3, help='timed rounds of each contender')
    ap.add_argument('--bs', type=int, default=256, help='training batch size')
    ap.add_argument('--threads', type=int, default=1, help='torch threads')
    ap.add_argument('--channels-last', action='store_true', help='also time both in channels_last')
    ap.add_argument('--compile', action='store_true', help='also time both with torch.compile')
    args = ap.parse_args(argv)
    for name in ('batches', 'valid_batches'):
        if getattr(args, name) < 0:
            ap.error(f'--{name.replace("_", "-")} must be >= 0, got {getattr(args, name)}')
    for name in ('rounds', 'bs', 'threads'):
        if getattr(args, name) < 1:
            ap.error(f'--{name} must be >= 1, got {getattr(args, name)}')
    return args


def images(x: torch.Tensor, n: int) -> torch.Tensor:
    "The first `n` rows of the flat `x` (all of them for n = 0) as (1, 28, 28) images."
    return (x if n == 0 else x[:n]).reshape(-1, 1, 28, 28).contiguous()


class Bench:
    "The data, the model and the two contenders, for one set of options."

    def __init__(self, args: argparse.Namespace):
        x, y, xv, yv, self.data_name = fashion_or_random()
        n, nv = args.batches * args.bs, args.valid_batches * args.bs * 2
        self.train_ds = Dataset(images(x, n), y[:n] if n else y)
        self.valid_ds = Dataset(images(xv, nv), yv[:nv] if nv else yv)
        self.bs = args.bs

    def loaders(self):
        "Fresh loaders with a fixed seed: both contenders see exactly the same batches."
        return (
            DataLoader(self.train_ds, Sampler(self.train_ds, self.bs, shuffle=True, seed=0)),
            DataLoader(self.valid_ds, Sampler(self.valid_ds, self.bs * 2)),
        )

    def model(self, channels_last: bool):
        torch.manual_seed(0)
        model = resnet()
        return model.to(memory_format=torch.channels_last) if channels_last else model

    def ours(self, channels_last: bool = False, model=None):
        """`learn.fit(1)` as a user writes it: the model and the table's four averages (on
        `model` where given, else on a fresh one)."""
        cbs = [BatchTransformXCallback(to_channels_last)] if channels_last else []
        learn = Learner(
            DataBunch(*self.loaders(), c=10),
            self.model(channels_last) if model is None else model,
            lr=LR,
            opt_func=lambda params, lr: AdamW(params, lr=lr, weight_decay=WD),
            metrics=[accuracy],
            cbs=cbs,
        )
        learn.display = 'off'
        with contextlib.redirect_stdout(io.StringIO()):  # the table, drawn into a buffer
            learn.fit(1)
        row = learn.run.avg_stats.history[-1]
        keys = ('train_loss', 'train_accuracy', 'valid_loss', 'valid_accuracy')
        return learn.model, [row[k] for k in keys]

    def by_hand(self, channels_last: bool = False, model=None):
        """The loop a careful engineer writes, with the same sums: the model and the four averages
        (on `model` where given, else on a fresh one)."""
        model = self.model(channels_last) if model is None else model
        opt = AdamW(model.parameters(), lr=LR, weight_decay=WD)
        train_dl, valid_dl = self.loaders()
        sums = [torch.zeros(()) for _ in range(4)]
        model.train()
        for xb, yb in train_dl:
            if channels_last:
                xb = to_channels_last(xb)
            pred = model(xb)
            loss = F.cross_entropy(pred, yb)
            sums[0].add_(loss.detach(), alpha=len(xb))
            sums[1].add_((pred.argmax(1) == yb).sum())
            loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for xb, yb in valid_dl:
                if channels_last:
                    xb = to_channels_last(xb)
                pred = model(xb)
                sums[2].add_(F.cross_entropy(pred, yb), alpha=len(xb))
                sums[3].add_((pred.argmax(1) == yb).sum())
        n, nv = len(self.train_ds), len(self.valid_ds)
        return model, [float(s) / m for s, m in zip(sums, (n, n, nv, nv))]


def fastai_contender(bench: Bench):
    "A run of fastai's Learner on the bench's model and data, or why it cannot run here (a str)."
    try:
        from fastai.basics import DataLoaders, accuracy as fastai_accuracy
        from fastai.basics import Learner as FastaiLearner
        from fastai.callback.progress import ProgressCallback  # noqa: F401  (Learner.no_bar)
        from fastai.optimizer import Adam
    except Exception as e:  # not installed, or an install that does not import
        return f'not run: {type(e).__name__}: {e}'

    def run():
        torch.manual_seed(0)
        dls = DataLoaders.from_dsets(bench.train_ds, bench.valid_ds, bs=bench.bs, device='cpu')
        learn = FastaiLearner(
            dls,
            bench.model(False),
            loss_func=F.cross_entropy,
            opt_func=Adam,
            wd=WD,
            metrics=fastai_accuracy,
        )
        with learn.no_bar(), learn.no_logging():
            learn.fit(1, LR)
        return learn.recorder.values

    try:
        run()  # one run: a peer that imports but fails to train is reported, not timed
    except Exception as e:
        return f'not run: {type(e).__name__}: {e}'
    return run


def check_same(a, b, what: str) -> None:
    "Stop unless the two runs `a` and `b` ended with the same weights and the same averages."
    (ma, sa), (mb, sb) = a, b
    same = all(
        torch.equal(p, q) for p, q in zip(ma.state_dict().values(), mb.state_dict().values())
    )
    close = all(abs(u - v) <= 1e-6 * max(1.0, abs(v)) for u, v in zip(sa, sb))
    if not (same and close):
        sys.exit(
            f'bench_resnet.py: error: {what}: the runs differ (weights equal: {same}, {sa} {sb})'
        )


def timed_rounds(fns, rounds: int) -> list[list[float]]:
    "The CPU time of each of `fns` in each round, interleaved, after one warm-up run each."
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times):
            t0 = CLOCK()
            fn()
            ts.append(CLOCK() - t0)
    return times


def ratio_line(name: str, ours: list[float], hand: list[float]) -> None:
    ratios = [o / h for o, h in zip(ours, hand)]
    report(name, statistics.median(ratios), '.3f')
    report(f'{name}_spread', f'{min(ratios):.3f}-{max(ratios):.3f}')


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = Bench(args)
    report('data', bench.data_name)
    report('train_images', len(bench.train_ds))
    report('valid_images', len(bench.valid_ds))
    report('threads', torch.get_num_threads())
    report('params', sum(p.numel() for p in bench.model(False).parameters()))
    run = bench.ours()
    check_same(run, bench.by_hand(), 'ours against the hand loop')
    report('same_weights_and_stats', True)
    report('stats', ', '.join(f'{v:.4f}' for v in run[1]) + ' (train loss, acc, valid loss, acc)')
    fns = [bench.ours, bench.by_hand]
    if args.channels_last:
        check_same(bench.ours(True), bench.by_hand(True), 'in channels_last')
        fns += [lambda: bench.ours(True), lambda: bench.by_hand(True)]
    if args.compile:
        compiled = torch.compile(bench.model(False))
        t0 = CLOCK()
        bench.by_hand(model=compiled)  # compiles: the training graph and the validation one
        report('compile_s', CLOCK() - t0, '.1f')
        first = len(fns)
        fns += [lambda: bench.ours(model=compiled), lambda: bench.by_hand(model=compiled)]
    fastai = fastai_contender(bench)
    if callable(fastai):
        fns.append(fastai)
    else:
        report('fastai', fastai)
    times = timed_rounds(fns, args.rounds)
    ours, hand = times[0], times[1]
    report('ours_s', statistics.median(ours), '.2f')
    report('hand_s', statistics.median(hand), '.2f')
    report('hand_ms_per_batch', 1e3 * statistics.median(hand) / len(bench.loaders()[0]), '.1f')
    ratio_line('ratio', ours, hand)
    goal = statistics.median(o / h for o, h in zip(ours, hand)) <= 1.02
    report('goal', '<= 1.02 (' + ('met' if goal else 'missed') + ')')
    if args.channels_last:
        ours_cl, hand_cl = times[2], times[3]
        report('channels_last_ours_s', statistics.median(ours_cl), '.2f')
        report('channels_last_hand_s', statistics.median(hand_cl), '.2f')
        ratio_line('channels_last_ratio', ours_cl, hand_cl)
        report(
            'channels_last_speedup',
            statistics.median(h / c for h, c in zip(hand, hand_cl)),
            '.3f',
        )
    if args.compile:
        ours_c, hand_c = times[first], times[first + 1]
        report('compiled_ours_s', statistics.median(ours_c), '.2f')
        report('compiled_hand_s', statistics.median(hand_c), '.2f')
        ratio_line('compiled_ratio', ours_c, hand_c)
        report('compile_speedup', statistics.median(h / c for h, c in zip(hand, hand_c)), '.3f')
    if callable(fastai):
        report('fastai_s', statistics.median(times[-1]), '.2f')
        ratio_line('fastai_ratio', times[-1], hand)


if __name__ == '__main__':
    main()

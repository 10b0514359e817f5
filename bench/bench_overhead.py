"""The training loop's overhead as users run it: `learn.fit_one_cycle(1)` with `metrics=[accuracy]`
against a loop written by hand that does the same work, on Fashion-MNIST (60,000 train, 10,000
valid), bs 64, SGD with momentum, one-cycle: the MLP 784-50-10 and the lesson's CNN (conv
1-8-16-32-32). Goals: the MLP within 1.05x of the hand loop, the CNN within 1.02x, with the console
progress bar within 1.07x.

The same work means: the same batches (the same Sampler, seed and tensors), the same weights at the
start, the same lr and momentum at every batch (the hand loop computes the one-cycle values for its
epoch before its first batch, with the same schedule functions, as ParamScheduler does, and sets
them into the optimizer's param groups), and the same sums (loss and accuracy over the training and
the validation set, as the Learner's table shows them). Before timing, the script checks that both
end with bit-identical weights and statistics.

The Learner also does work the hand loop leaves out: its Recorder keeps the lr and the loss of every
training batch, and `fit` stops at a training loss that is not finite. The goals are against the
hand loop as it is; a second hand loop that does that work too (`by_hand(record=True)`, checked to
keep the same lrs and losses as the Recorder) is timed beside it, so that `mlp_hand_recording_ratio`
gives what that work costs written by hand and `mlp_ours_vs_recording_hand_ratio` what the callbacks
cost beyond it; the CNN's rounds time it too (`cnn_...`).

torch runs on one thread. Ours and the hand loop alternate, many rounds, in one process; each line
gives the median and the spread (min-max) over the rounds of the ratio ours / hand.
`overhead_us_per_batch` is the difference of the medians over the training batches. Plain PyTorch
(torch's DataLoader and OneCycleLR) and, where installed (`pip install torch==2.13.0 -e
".[peers]"`), Lightning and fastai train the same model on the same data, each as its documentation
has it, against the same hand loop.

With --bounds it also times the MLP with parts of the per-batch work removed (the two
ParamSchedulers' writes, the Recorder and the non-finite-loss check, then all three): not the same
work any more, but how far a redesign of those parts could take the ratio.

With --fused it also times the floor of the callback design on the MLP: the same work as ours
(checked to the last bit against it: weights, sums, lrs and losses), done by one callback,
`FusedBound`, on the plain Runner. That is two callbacks a batch (FusedBound and the Runner's own
counters, TrainEvalCallback) where `fit_one_cycle` has seven (the counters, two ParamSchedulers,
AvgStats, the Recorder, the non-finite check and the progress display). Not a design this project
ships: it is what merging those six into one could save, the most any trim of them could.
`mlp_fused_minus_ours_us_per_batch` is the median over the rounds of the per-round difference.

With --python-cost it measures what a Python call costs inside the training loop: the hand loop
calls a plain Python function at every training batch (between the schedule's writes and the forward
pass), one that loops over `range(k)` adding integers and touches no tensor, for each k of
PYTHON_COST_KS. Each line gives the function's cost timed alone in a tight loop, and what it added
to the hand loop per batch (the median over the rounds of the per-round difference).

    python bench/bench_overhead.py [--rounds 15] [--cnn-rounds 5] [--peer-rounds 3] [--no-cnn]
    [--no-peers] [--bounds]
                                   [--fused] [--python-cost]
"""

import argparse
import contextlib
import io
import math
import statistics
import time
import timeit
from functools import partial

import torch

torch.set_num_threads(1)  # before any work: the figures are for one thread

import torch.nn.functional as F
from torch import nn

from common import fashion_or_random, report
import exp.learner  # noqa: F401  (adds fit_one_cycle to Learner)
from exp.anneal import ParamScheduler, Recorder, sched_1cycle
from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.cnn import BatchTransformXCallback, get_cnn_model, view_tfm
from exp.learner import TerminateOnNaNCallback
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD

BS, MOMENTUM = 64, 0.9
CLOCK = time.process_time
LR = {'mlp': 0.1, 'cnn': 0.1}
# fit_one_cycle's defaults, written out for the hand loop and the peers
PCT_START, MOMS, DIV, FINAL_DIV = 0.3, (0.95, 0.85), 25.0, 25.0 * 1e4

x, y, xv, yv, data_name = fashion_or_random()
train_ds, valid_ds = Dataset(x, y), Dataset(xv, yv)
to_images = view_tfm(1, 28, 28)


def loaders():
    "Fresh loaders with a fixed seed: every contender sees exactly the same batches."
    return (
        DataLoader(train_ds, Sampler(train_ds, BS, shuffle=True, seed=0)),
        DataLoader(valid_ds, Sampler(valid_ds, BS * 2)),
    )


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))


def cnn():
    torch.manual_seed(0)
    return get_cnn_model(DataBunch(None, None, c=10))


MODELS = {'mlp': mlp, 'cnn': cnn}
N_BATCHES = len(loaders()[0])


def one_cycle_values(arch: str) -> list:
    """The (lr, momentum) fit_one_cycle sets at each training batch of one epoch: its schedules at
    the positions it uses."""
    lr_sched, mom_sched = sched_1cycle(
        LR[arch],
        PCT_START,
        mom_start=MOMS[0],
        mom_mid=MOMS[1],
        mom_end=MOMS[0],
        div_start=DIV,
        div_end=FINAL_DIV,
    )
    lr_f, mom_f = lr_sched.sched_funcs[0], mom_sched.sched_funcs[0]
    values, n_epochs = [], 0.0
    # the position counts epochs as the runner does: 1/len(train_dl) added per batch
    for _ in range(N_BATCHES):
        values.append((lr_f(n_epochs), mom_f(n_epochs)))
        n_epochs += 1.0 / N_BATCHES
    return values


def by_hand(arch: str, call=None, record: bool = False):
    """The loop a careful engineer writes: one-cycle values set per batch, loss and accuracy summed
    on the way (`call`: see
    --python-cost). With `record`, it also does what the Learner's Recorder and non-finite-loss
    check do at every training batch: keep each group's lr and the loss, and stop at a loss that is
    not finite. Returns the model, the four sums' averages, and what it recorded (the lrs of each
    group and the losses; None without `record`)."""
    model = MODELS[arch]()
    opt = SGD(model.parameters(), lr=LR[arch], momentum=MOMENTUM)
    train_dl, valid_dl = loaders()
    tfm = to_images if arch == 'cnn' else None
    train_loss, train_correct, valid_loss, valid_correct = (torch.zeros(()) for _ in range(4))
    lrs, losses = [[] for _ in opt.param_groups], []
    model.train()
    # computed in the run: ours computes it in the fit
    for (xb, yb), (lr, mom) in zip(train_dl, one_cycle_values(arch)):
        for pg in opt.param_groups:
            pg['lr'], pg['momentum'] = lr, mom
        if call is not None:
            call()
        if tfm is not None:
            xb = tfm(xb)
        pred = model(xb)
        loss = F.cross_entropy(pred, yb)
        train_loss.add_(loss.detach(), alpha=len(xb))
        train_correct.add_((pred.argmax(1) == yb).sum())
        if record:
            for group_lrs, pg in zip(lrs, opt.param_groups):
                group_lrs.append(pg['lr'])
            losses.append(loss.detach())
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f'training loss {loss.item()}')
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        for xb, yb in valid_dl:
            if tfm is not None:
                xb = tfm(xb)
            pred = model(xb)
            valid_loss.add_(F.cross_entropy(pred, yb), alpha=len(xb))
            valid_correct.add_((pred.argmax(1) == yb).sum())
    n, nv = len(train_ds), len(valid_ds)
    stats = [
        float(train_loss) / n,
        float(train_correct) / n,
        float(valid_loss) / nv,
        float(valid_correct) / nv,
    ]
    return model, stats, ((lrs, losses) if record else None)


def ours(arch: str, display: str = 'off'):
    """`learn.fit_one_cycle(1)` as a user writes it, with the progress display `display`: the model,
    the table's sums, what the Recorder kept."""
    cbs = [BatchTransformXCallback(to_images)] if arch == 'cnn' else []
    learn = Learner(
        DataBunch(*loaders(), c=10),
        MODELS[arch](),
        lr=LR[arch],
        metrics=[accuracy],
        opt_func=partial(SGD, momentum=MOMENTUM),
        cbs=cbs,
    )
    learn.display = display
    # the table (and the bar) are drawn, into a buffer
    with contextlib.redirect_stdout(io.StringIO()):
        learn.fit_one_cycle(1)
    row = learn.run.avg_stats.history[-1]
    recorder = learn.run.recorder
    return (
        learn.model,
        [row['train_loss'], row['train_accuracy'], row['valid_loss'], row['valid_accuracy']],
        (recorder.lrs, recorder.losses),
    )


# the per-batch handlers --bounds removes, by the part of the work they do
BOUNDS = {
    'schedulers': [(ParamScheduler, 'begin_batch')],
    'recorder_and_nan_check': [(Recorder, 'after_loss'), (TerminateOnNaNCallback, 'after_loss')],
}


@contextlib.contextmanager
def without(methods: list):
    "Within the block, each handler of `methods` (class, name) does nothing."
    saved = [(cls, name, cls.__dict__[name]) for cls, name in methods]
    try:
        for cls, name, _ in saved:
            setattr(cls, name, lambda self: None)
        yield
    finally:
        for cls, name, handler in saved:
            setattr(cls, name, handler)


def ours_without(*parts: str):
    "`ours('mlp')` with the per-batch handlers of `parts` (keys of BOUNDS) doing nothing."

    def run():
        with without([m for part in parts for m in BOUNDS[part]]):
            return ours('mlp')

    return run


class FusedBound(Callback):
    """Every per-batch job of fit_one_cycle's callbacks on the MLP in one: the one-cycle writes, the
    sums, the Recorder's lists, the non-finite check."""

    def begin_fit(self):
        # computed in the run, as ParamScheduler computes its table in the fit
        self.values = one_cycle_values('mlp')
        self.lrs, self.losses = [[] for _ in self.opt.param_groups], []
        # by in_train: loss, correct
        self.sums = {
            True: [torch.zeros(()), torch.zeros(())],
            False: [torch.zeros(()), torch.zeros(())],
        }
        self.counts = {True: 0, False: 0}

    def begin_epoch(self):
        self.i = 0

    def begin_batch(self):
        run = self.run
        if not run.in_train:
            return
        lr, mom = self.values[self.i]
        for pg in run.learn.opt.param_groups:
            pg['lr'], pg['momentum'] = lr, mom

    def after_loss(self):
        run = self.run
        loss, pred, yb, n = run.loss.detach(), run.pred, run.yb, len(run.xb)
        tot_loss, tot_correct = self.sums[run.in_train]
        tot_loss.add_(loss, alpha=n)
        tot_correct.add_((pred.argmax(1) == yb).sum())
        self.counts[run.in_train] += n
        if not run.in_train:
            return
        for lrs, pg in zip(self.lrs, run.learn.opt.param_groups):
            lrs.append(pg['lr'])
        self.losses.append(loss)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f'training loss {loss.item()}')
        self.i += 1


def fused():
    """`FusedBound` on the plain Runner, one epoch of the MLP: the model, the four averages, what it
    recorded (as `ours` returns them)."""
    learn = Learner(
        DataBunch(*loaders(), c=10), mlp(), lr=LR['mlp'], opt_func=partial(SGD, momentum=MOMENTUM)
    )
    cb = FusedBound()
    Runner(cbs=[cb]).fit(1, learn)
    averages = [
        float(s) / cb.counts[in_train] for in_train in (True, False) for s in cb.sums[in_train]
    ]
    return learn.model, averages, (cb.lrs, cb.losses)


def fused_same_as_ours() -> bool:
    """Whether FusedBound ends where fit_one_cycle does on the MLP, to the last bit: weights, the
    four averages, the lrs and losses recorded."""
    (m1, s1, (lrs1, losses1)), (m2, s2, (lrs2, losses2)) = ours('mlp'), fused()
    return (
        all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
        and s1 == s2
        and lrs1 == lrs2
        and torch.equal(torch.stack(losses1), torch.stack(losses2))
    )


# iterations of the plain-Python function --python-cost inserts into the hand loop
PYTHON_COST_KS = (0, 30, 300)


def python_work(k: int):
    "A function that runs `k` iterations of plain Python (integer additions) and touches no tensor."

    def work():
        total = 0
        for i in range(k):
            total += i
        return total

    return work


def alone_us(fn, number: int = 20_000, repeat: int = 5) -> float:
    """`fn`'s cost in us per call, timed alone in a tight loop (the minimum over `repeat` runs of
    `number` calls)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def python_cost(rounds: int) -> None:
    """What a plain-Python call costs at every batch of the hand loop, against its cost alone, for
    each k of PYTHON_COST_KS."""
    fns = {'hand': partial(by_hand, 'mlp')}
    fns.update({f'k{k}': partial(by_hand, 'mlp', python_work(k)) for k in PYTHON_COST_KS})
    t = rounds_of(fns, rounds)
    for k in PYTHON_COST_KS:
        in_loop = statistics.median(a - b for a, b in zip(t[f'k{k}'], t['hand'])) / N_BATCHES * 1e6
        report(
            f'python_cost_k{k}_us',
            f'{alone_us(python_work(k)):.2f} alone, {in_loop:.2f} in the training loop',
        )


def rounds_of(fns: dict, rounds: int) -> dict:
    """Wall times of each of `fns` over `rounds` rounds, after one warm-up each; the order flips
    every round."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = CLOCK()
            fns[name]()
            times[name].append(CLOCK() - t0)
    return times


def report_ratio(
    prefix: str, times: list, ref: list, goal: float | None = None, epoch: bool = True
) -> None:
    """Median time (unless not `epoch`), the ratio of medians to `ref`, the spread of the per-round
    ratios, and the overhead per batch."""
    med, med_ref = statistics.median(times), statistics.median(ref)
    ratios = [t / r for t, r in zip(times, ref)]
    if epoch:
        report(f'{prefix}_epoch_s', med)
    report(f'{prefix}_ratio', med / med_ref, '.3f')
    report(f'{prefix}_ratio_spread', f'{min(ratios):.3f}-{max(ratios):.3f}')
    report(f'{prefix}_overhead_us_per_batch', (med - med_ref) / N_BATCHES * 1e6, '.1f')
    if goal is not None:
        report(f'{prefix}_goal', f'<= {goal} ({"met" if med / med_ref <= goal else "missed"})')


def same_work(arch: str) -> None:
    """Check that ours and the hand loop (without and with recording) computed the same thing, to
    the last bit, before timing them."""
    m1, s1, (lrs1, losses1) = ours(arch)
    m2, s2, _ = by_hand(arch)
    m3, s3, (lrs3, losses3) = by_hand(arch, record=True)
    same_weights = all(
        torch.equal(a, b) and torch.equal(a, c)
        for a, b, c in zip(
            m1.state_dict().values(), m2.state_dict().values(), m3.state_dict().values()
        )
    )
    same_recording = (
        lrs1 == lrs3
        and len(losses1) == len(losses3)
        and torch.equal(torch.stack(losses1), torch.stack(losses3))
    )
    report(f'{arch}_same_weights', same_weights)
    report(f'{arch}_same_stats', s1 == s2 == s3)
    report(f'{arch}_same_recording', same_recording)
    report(
        f'{arch}_stats',
        ', '.join(f'{v:.4f}' for v in s1) + ' (train loss, train acc, valid loss, valid acc)',
    )
    if not (same_weights and s1 == s2 == s3 and same_recording):
        raise SystemExit(f'{arch}: ours and the hand loop did not do the same work')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--rounds', type=int, default=15, help='rounds for the MLP')
    ap.add_argument('--cnn-rounds', type=int, default=5, help='rounds for the CNN')
    ap.add_argument(
        '--peer-rounds', type=int, default=3, help='rounds for each peer (against the hand loop)'
    )
    ap.add_argument('--no-cnn', action='store_true', help='skip the CNN')
    ap.add_argument(
        '--no-peers', action='store_true', help='skip plain PyTorch, Lightning and fastai'
    )
    ap.add_argument(
        '--bounds',
        action='store_true',
        help='also time the MLP with parts of the per-batch work removed',
    )
    ap.add_argument(
        '--fused',
        action='store_true',
        help="also time the MLP's per-batch work done by one callback: the callback design's floor",
    )
    ap.add_argument(
        '--python-cost',
        action='store_true',
        help='also time a plain-Python call inside the hand loop, against its cost alone',
    )
    args = ap.parse_args()

    report(
        'data',
        f'{data_name}, {len(train_ds)} train, {len(valid_ds)} valid, bs {BS}, {N_BATCHES} training '
        'batches',
    )
    report('torch', f'{torch.__version__}, {torch.get_num_threads()} thread')
    archs = ['mlp'] + ([] if args.no_cnn else ['cnn'])
    for arch in archs:
        same_work(arch)

    t = rounds_of(
        {
            'hand': partial(by_hand, 'mlp'),
            'ours': partial(ours, 'mlp'),
            'console': partial(ours, 'mlp', 'console'),
            'recording': partial(by_hand, 'mlp', record=True),
        },
        args.rounds,
    )
    report('mlp_hand_epoch_s', statistics.median(t['hand']))
    report_ratio('mlp_ours', t['ours'], t['hand'], 1.05)
    report_ratio('mlp_console_bar', t['console'], t['hand'], 1.07)
    # not the goal's loop: the hand loop that also keeps the lrs and losses and checks each loss, as
    # ours does
    report_ratio('mlp_hand_recording', t['recording'], t['hand'])
    # ours' epoch: above
    report_ratio('mlp_ours_vs_recording_hand', t['ours'], t['recording'], epoch=False)
    if args.bounds:  # not the same work: bounds on what a redesign of each part could save
        t = rounds_of(
            {
                'hand': partial(by_hand, 'mlp'),
                'ours': partial(ours, 'mlp'),
                'schedulers': ours_without('schedulers'),
                'recorder_and_nan_check': ours_without('recorder_and_nan_check'),
                'all_three': ours_without(*BOUNDS),
            },
            args.rounds,
        )
        report_ratio('mlp_bound_ours', t['ours'], t['hand'])
        for part in ('schedulers', 'recorder_and_nan_check', 'all_three'):
            report_ratio(f'mlp_bound_without_{part}', t[part], t['hand'])
    # not a design this project ships: the floor of merging fit_one_cycle's per-batch handlers into
    # one
    if args.fused:
        same = fused_same_as_ours()
        report('mlp_fused_same_work', same)
        if not same:
            raise SystemExit('mlp: FusedBound and fit_one_cycle did not do the same work')
        t = rounds_of(
            {'hand': partial(by_hand, 'mlp'), 'ours': partial(ours, 'mlp'), 'fused': fused},
            args.rounds,
        )
        report_ratio('mlp_fused_ours', t['ours'], t['hand'])
        report_ratio('mlp_fused', t['fused'], t['hand'])
        saved = statistics.median(f - o for f, o in zip(t['fused'], t['ours'])) / N_BATCHES * 1e6
        report('mlp_fused_minus_ours_us_per_batch', saved, '.1f')
    if args.python_cost:
        python_cost(args.rounds)
    if 'cnn' in archs:
        t = rounds_of(
            {
                'hand': partial(by_hand, 'cnn'),
                'ours': partial(ours, 'cnn'),
                'recording': partial(by_hand, 'cnn', record=True),
            },
            args.cnn_rounds,
        )
        report('cnn_hand_epoch_s', statistics.median(t['hand']))
        report_ratio('cnn_ours', t['ours'], t['hand'], 1.02)
        # as for the MLP: not the goal's loop
        report_ratio('cnn_hand_recording', t['recording'], t['hand'])
        report_ratio('cnn_ours_vs_recording_hand', t['ours'], t['recording'], epoch=False)
    if not args.no_peers:
        import peers

        for name, fn in peers.contenders(x, y, xv, yv, BS, LR['mlp'], MOMS, DIV, PCT_START).items():
            if isinstance(fn, str):
                report(f'mlp_{name}', fn)
                continue
            t = rounds_of({'hand': partial(by_hand, 'mlp'), name: fn}, args.peer_rounds)
            report_ratio(f'mlp_{name}', t[name], t['hand'])


if __name__ == '__main__':
    main()

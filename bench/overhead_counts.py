"""The training loop's overhead counted, not timed: bench_overhead.py's MLP work
(`learn.fit_one_cycle(1)` with `metrics=[accuracy]` against the hand loop) run under valgrind's
cachegrind, which simulates the CPU's caches and branch predictors and counts, deterministically,
the instructions executed, the level-1 instruction and data cache misses, the last-level misses and
the mispredicted branches. Where a 2-core VM's timings drift by 10% between rounds, these counts
barely move between runs (the instructions by 0.01%, the level-1 misses by under 0.5%), so they show
a change of the per-batch path that timing there cannot.

Each contender runs in its own process, once and twice (one epoch each time): the difference is one
epoch's counts, without the imports and the data loading. Hash randomisation, address-space
randomisation (setarch -R, where it exists) and the BLAS/OpenMP thread pools (one thread) are fixed
so that two runs execute the same instructions at the same addresses. With --parts it also counts
ours with the per-batch handlers of bench_overhead's --bounds doing nothing (the schedulers, the
Recorder and the non-finite check): what each part costs. With --functions N it prints where ours'
extra cycles go: ours' epoch less the hand loop's, function by function (`file:function`, as
cachegrind names them; `???` for code without symbols), the N that cost most, per training batch.

Cycles are not counted; `est_cycles` is a rough model of them: one per instruction, 12 per level-1
miss, 15 per mispredicted branch. Its ratio is what to read, not its cycles (a real core overlaps
much of a miss): on the AMD EPYC VM it gave 1.036 where the timed ratio was 1.040-1.058, and the
instructions alone 1.028. Last-level misses are left out of it: where cachegrind cannot model the
host's last-level cache it simulates a direct-mapped one (it warns so), whose misses move with the
memory layout more than with the code.

Needs valgrind (`apt-get install -y valgrind`). Under it a run is 50-100 times slower: 5-13 minutes
of one core per process, four processes (two more with --recording, two more with --fused, six more
with --parts), two at a time: about 20 minutes on two cores.

With --recording it also counts bench_overhead's hand loop that records as the Learner does (each
batch's lr and loss kept, the loss checked for nan or inf), and gives ours' ratio to it. With
--fused it also counts bench_overhead's FusedBound (the same work in one callback, the floor of the
callback design; see its --fused) and what it saves.

With --cnn it counts the lesson's CNN instead of the MLP (ours and the hand loop, and with
--recording the hand loop that records). Its epoch is 3.5 s, which under cachegrind takes 25 minutes
and more, so --batches N shortens the epoch to its first N training batches (and as large a share of
the validation set) for every contender: `--cnn
--batches 100` takes about 20 minutes on two cores. A fit's fixed cost (about 1 ms) is then spread
over fewer batches.

    python bench/overhead_counts.py [--parts] [--recording] [--fused] [--functions 25] [--jobs 2]
    [--cnn] [--batches N]
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
WEIGHTS = {'Ir': 1, 'I1mr': 12, 'D1mr': 12, 'D1mw': 12, 'Bcm': 15, 'Bim': 15}
ENV = {
    'PYTHONHASHSEED': '0',
    'OMP_NUM_THREADS': '1',
    'MKL_NUM_THREADS': '1',
    'OPENBLAS_NUM_THREADS': '1',
}


def parts(bounds: dict) -> dict[str, list[str]]:
    """The contenders of --parts: ours without each part of bench_overhead's BOUNDS, then without
    all of them."""
    return {**{f'without_{p}': [p] for p in bounds}, 'without_all_three': list(bounds)}


def shorten(b, n_batches: int) -> None:
    """Make bench_overhead `b`'s epoch its first `n_batches` training batches and as large a share
    of the validation set."""
    if not 0 < n_batches <= b.N_BATCHES:
        raise SystemExit(f'--batches must be in [1, {b.N_BATCHES}], got {n_batches}')
    # the last batch may be short: N_BATCHES is the whole epoch
    n = min(n_batches * b.BS, len(b.train_ds))
    nv = n * len(b.valid_ds) // len(b.train_ds)
    b.train_ds, b.valid_ds = b.Dataset(b.x[:n], b.y[:n]), b.Dataset(b.xv[:nv], b.yv[:nv])
    b.N_BATCHES = n_batches


def child(contender: str, runs: int, arch: str = 'mlp', n_batches: int = 0) -> None:
    """Run `contender` ('hand', 'ours', 'hand_recording', 'fused' or a key of `parts`) on `arch`
    `runs` times, in this process (the one valgrind watches); `n_batches`: see `shorten`."""
    sys.path.insert(0, str(HERE))
    import bench_overhead as b

    if n_batches:
        shorten(b, n_batches)
    fn = {
        'hand': lambda: b.by_hand(arch),
        'ours': lambda: b.ours(arch),
        'hand_recording': lambda: b.by_hand(arch, record=True),
        'fused': b.fused,
    }.get(contender)
    if fn is None:
        fn = b.ours_without(*parts(b.BOUNDS)[contender])
    for _ in range(runs):
        fn()


def summary(path: str | os.PathLike) -> dict[str, int]:
    """The totals of a cachegrind output file: {event: count}, from its 'events:' and 'summary:'
    lines."""
    events = totals = None
    for line in Path(path).read_text().splitlines():
        if line.startswith('events:'):
            events = line.split()[1:]
        elif line.startswith('summary:'):
            totals = [int(v) for v in line.split()[1:]]
    if events is None or totals is None or len(events) != len(totals):
        raise ValueError(
            f"{path} is not a cachegrind output file: no matching 'events:' and 'summary:' lines"
        )
    return dict(zip(events, totals))


def functions(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """The counts of a cachegrind output file by function: {'file:function': {event: count}} (the
    file without its folders)."""
    events, fl, fn, out = None, '???', '???', {}
    with open(path) as f:
        for line in f:
            # a source line of the current function: its number, then its counts (trailing zeros
            # left out)
            if line[:1].isdigit():
                if events is None:
                    break
                counts = out.setdefault(f'{fl}:{fn}', [0] * len(events))
                for i, v in enumerate(line.split()[1:]):
                    counts[i] += int(v)
            elif line.startswith('fn='):
                fn = line[3:].strip()
            elif line.startswith('fl='):
                fl = os.path.basename(line[3:].strip())
            elif line.startswith('events:'):
                events = line.split()[1:]
    if events is None:
        raise ValueError(
            f"{path} is not a cachegrind output file: no 'events:' line before its counts"
        )
    return {name: dict(zip(events, counts)) for name, counts in out.items()}


def overhead_by_function(
    hand_once: dict, hand_twice: dict, ours_once: dict, ours_twice: dict
) -> dict[str, dict[str, int]]:
    "Ours' epoch less the hand loop's, function by function, from the four processes' `functions`."
    zero = dict.fromkeys(next(iter(ours_twice.values())), 0)  # a function one process never ran

    def extra(name: str) -> dict[str, int]:
        ours = per_epoch(ours_once.get(name, zero), ours_twice.get(name, zero))
        hand = per_epoch(hand_once.get(name, zero), hand_twice.get(name, zero))
        return {e: ours[e] - hand[e] for e in zero}

    return {
        name: extra(name)
        for name in set(hand_once) | set(hand_twice) | set(ours_once) | set(ours_twice)
    }


def est_cycles(counts: dict[str, int]) -> float:
    "The rough cycle model of the docstring, over the events `counts` has."
    return sum(WEIGHTS[k] * v for k, v in counts.items() if k in WEIGHTS)


def per_epoch(once: dict[str, int], twice: dict[str, int]) -> dict[str, int]:
    "One epoch's counts: those of two runs less those of one."
    return {k: twice[k] - once[k] for k in twice}


def counted(
    contender: str, runs: int, out_dir: str, arch: str = 'mlp', n_batches: int = 0
) -> dict[str, int]:
    """Run `contender` on `arch` `runs` times under cachegrind, in a fresh process (its output file:
    `out_dir`/`contender`.`runs`); its totals."""
    out = Path(out_dir) / f'{contender}.{runs}'
    no_aslr = ['setarch', platform.machine(), '-R'] if shutil.which('setarch') else []
    cmd = [
        *no_aslr,
        'valgrind',
        '--tool=cachegrind',
        '--cache-sim=yes',
        '--branch-sim=yes',
        f'--cachegrind-out-file={out}',
        sys.executable,
        __file__,
        '--child',
        contender,
        str(runs),
        arch,
        str(n_batches),
    ]
    res = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{contender} x{runs} failed under valgrind:\n{res.stderr[-2000:]}")
    return summary(out)


def line(name: str, epoch: dict[str, int], n_batches: int) -> str:
    "One contender's epoch: instructions and misses per training batch, and the cycle estimate."
    mis = epoch['Bcm'] + epoch['Bim']
    return (
        f"{name}: {epoch['Ir'] / n_batches:,.0f} instructions, {epoch['I1mr'] / n_batches:,.0f} I1 "
        "misses, "
        f"{(epoch['D1mr'] + epoch['D1mw']) / n_batches:,.0f} D1 misses, {mis / n_batches:,.0f} "
        "mispredicted branches, "
        f"{est_cycles(epoch) / n_batches:,.0f} est_cycles per training batch"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument(
        '--parts', action='store_true', help="also count ours without each part of --bounds"
    )
    ap.add_argument(
        '--recording',
        action='store_true',
        help="also count the hand loop that records as the Learner does",
    )
    ap.add_argument(
        '--fused',
        action='store_true',
        help="also count bench_overhead's FusedBound, the callback design's floor",
    )
    ap.add_argument(
        '--functions',
        type=int,
        default=0,
        metavar='N',
        help="also print the N functions where ours' extra cycles go",
    )
    ap.add_argument('--jobs', type=int, default=2, help='processes under valgrind at once')
    ap.add_argument(
        '--cnn',
        action='store_true',
        help="count the lesson's CNN instead of the MLP (with --recording at most)",
    )
    ap.add_argument(
        '--batches',
        type=int,
        default=0,
        metavar='N',
        help='an epoch of the first N training batches (and as large a share of the validation '
        'set), not all 938',
    )
    ap.add_argument(
        '--child', nargs=4, metavar=('CONTENDER', 'RUNS', 'ARCH', 'BATCHES'), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), args.child[2], int(args.child[3]))
    if args.cnn and (args.parts or args.fused):
        raise SystemExit('--parts and --fused count the MLP only: leave them out with --cnn')
    if shutil.which('valgrind') is None:
        raise SystemExit('valgrind is not installed: apt-get install -y valgrind')

    sys.path.insert(0, str(HERE))
    import bench_overhead

    if args.batches:
        shorten(bench_overhead, args.batches)
    from bench_overhead import BOUNDS, N_BATCHES, data_name

    part_names = list(parts(BOUNDS)) if args.parts else []
    # ours less some of its work, or the same work in one callback
    savers = [*part_names, *(['fused'] if args.fused else [])]
    contenders = ['hand', 'ours', *(['hand_recording'] if args.recording else []), *savers]
    arch = 'cnn' if args.cnn else 'mlp'
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(args.jobs) as pool:
        jobs = {
            (c, r): pool.submit(counted, c, r, d, arch, args.batches)
            for c in contenders
            for r in (1, 2)
        }
        epochs = {c: per_epoch(jobs[c, 1].result(), jobs[c, 2].result()) for c in contenders}
        by_function = args.functions and overhead_by_function(
            *(functions(Path(d) / f'{c}.{r}') for c in ('hand', 'ours') for r in (1, 2))
        )
    print(
        f'data: {data_name}, {N_BATCHES} training batches an epoch (the per-batch figures divide '
        f'by it); model: {arch}'
    )
    for c in contenders:
        print(line(c, epochs[c], N_BATCHES))
    hand, ours = epochs['hand'], epochs['ours']
    print(
        f"ours/hand: instructions {ours['Ir'] / hand['Ir']:.3f}, est_cycles "
        f"{est_cycles(ours) / est_cycles(hand):.3f}"
    )
    if args.recording:
        rec = epochs['hand_recording']
        print(
            f"hand_recording/hand: instructions {rec['Ir'] / hand['Ir']:.3f}, est_cycles "
            f"{est_cycles(rec) / est_cycles(hand):.3f}"
        )
        print(
            f"ours/hand_recording: instructions {ours['Ir'] / rec['Ir']:.3f}, est_cycles "
            f"{est_cycles(ours) / est_cycles(rec):.3f}"
        )
    for c in savers:
        saved = est_cycles(ours) - est_cycles(epochs[c])
        print(
            f"{c}: saves {(ours['Ir'] - epochs[c]['Ir']) / N_BATCHES:,.0f} instructions and "
            f"{saved / N_BATCHES:,.0f} "
            f"est_cycles a batch, {saved / (est_cycles(ours) - est_cycles(hand)):.0%} of ours' "
            "overhead"
        )
    if by_function:
        print_functions(by_function, args.functions, N_BATCHES)


def print_functions(by_function: dict[str, dict[str, int]], n: int, n_batches: int) -> None:
    """The `n` functions of `by_function` (ours less the hand loop) with the most est_cycles, per
    training batch, and the rest."""
    total = sum(est_cycles(c) for c in by_function.values())
    rows = sorted(by_function.items(), key=lambda kv: -est_cycles(kv[1]))
    print(
        f"where ours' extra est_cycles go, by function ({total / n_batches:,.0f} a training batch "
        "in all):"
    )
    print(
        f"{'est_cycles':>10} {'instr.':>8} {'I1 miss':>7} {'D1 miss':>7} {'mispred.':>8} "
        f"{'share':>6}  file:function"
    )
    for name, c in [
        *rows[:n],
        ('(all other functions)', {e: sum(r[e] for _, r in rows[n:]) for e in rows[0][1]}),
    ]:
        print(
            f"{est_cycles(c) / n_batches:>10,.0f} {c['Ir'] / n_batches:>8,.0f} "
            f"{c['I1mr'] / n_batches:>7,.0f} "
            f"{(c['D1mr'] + c['D1mw']) / n_batches:>7,.0f} "
            f"{(c['Bcm'] + c['Bim']) / n_batches:>8,.0f} "
            f"{est_cycles(c) / total:>6.1%}  {name}"
        )


if __name__ == '__main__':
    main()

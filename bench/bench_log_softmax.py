"""Our log_softmax (exp.loss) against F.log_softmax, forward only, float32, at a minibatch shape
(64, 10) and a large one (4096, 1000), timed in the same process. Target: ours within 1.5x of torch.
Also ours under torch.compile (one fused kernel per shape); where compiling fails (no C compiler),
the script says why and times eager only.

Ours and torch's are timed in alternating blocks (the order flipping every round), so a slow spell
of the machine hits both alike; each prints the median time per call over the rounds, and the ratio
of the medians. `--threads N` sets torch's thread count (default: torch's own, one per core); on a
shared machine one thread keeps the other users' load from stretching the multi-threaded kernels'
synchronisation.

    python bench/bench_log_softmax.py [--threads 1]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from exp.loss import log_softmax, try_compile

ROUNDS = 31
BLOCK_S = 0.02  # each timed block runs this long, so a block of the small shape holds ~1,000 calls


def report(name: str, value, fmt: str = '.4g') -> None:
    print(f'{name}: {value:{fmt}}' if isinstance(value, float) else f'{name}: {value}')


def per_call(fn, calls: int) -> float:
    "Seconds per call of `fn` over a block of `calls` calls."
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def median_per_call(*fns) -> list:
    "Median seconds per call of each of `fns`, timed in interleaved blocks after a warm-up."
    for fn in fns:
        for _ in range(3):
            fn()
    calls = max(1, round(BLOCK_S / min(per_call(fn, 10) for fn in fns)))
    times = [[] for _ in fns]
    for r in range(ROUNDS):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            times[i].append(per_call(fns[i], calls))
    return [statistics.median(ts) for ts in times]


ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
ap.add_argument(
    '--threads', type=int, default=None, help="torch's thread count (default: torch's own)"
)
args = ap.parse_args()
if args.threads is not None:
    if args.threads < 1:
        ap.error(f'--threads must be >= 1, got {args.threads}')
    torch.set_num_threads(args.threads)
report('torch_threads', torch.get_num_threads())
report('target_ratio', 1.5)
for rows, cols in [(64, 10), (4096, 1000)]:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)) * 3
    # timing something wrong is pointless
    torch.testing.assert_close(log_softmax(x), F.log_softmax(x, -1))
    name = f'log_softmax_{rows}x{cols}'
    compiled, why_not = try_compile(log_softmax, x, dynamic=False)
    fns = [lambda: log_softmax(x), lambda: F.log_softmax(x, -1)]
    if why_not is None:
        torch.testing.assert_close(compiled(x), F.log_softmax(x, -1))
        fns.append(lambda: compiled(x))
    else:
        report(f'{name}_compiled', f'not available ({why_not})')
    ours, theirs, *comp = median_per_call(*fns)
    report(f'{name}_ours_us', ours * 1e6, '.2f')
    report(f'{name}_torch_us', theirs * 1e6, '.2f')
    report(f'{name}_ratio', ours / theirs, '.2f')
    if comp:
        report(f'{name}_compiled_us', comp[0] * 1e6, '.2f')
        report(f'{name}_compiled_ratio', comp[0] / theirs, '.2f')
    torch.compiler.reset()

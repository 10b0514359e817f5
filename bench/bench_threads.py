"""How the thread settings change the trainer's wall time, on a quiet machine and on a busy one.

Runs `python -m exp.train --epochs N` in a fresh process under each setting, interleaved round by
round (so that drift in the machine's load hits every setting alike), first with nothing else
running, then with one busy process per core beside it (the load a laptop has when a browser or a
build runs, or a shared VM when its neighbours work). Prints each setting's median, min and max.

The settings: torch's default (one thread per core, idle OpenMP threads spinning a while before they
sleep), the same with `OMP_WAIT_POLICY=PASSIVE` (idle threads sleep at once), and one thread.
"""

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    'default (torch: a thread per core)': {},
    'passive wait': {'OMP_WAIT_POLICY': 'PASSIVE'},
    'one thread': {'OMP_NUM_THREADS': '1'},
    'one thread, passive wait': {'OMP_NUM_THREADS': '1', 'OMP_WAIT_POLICY': 'PASSIVE'},
}
# the variables a setting controls, removed from the environment before each run
CONTROLLED = ('OMP_NUM_THREADS', 'OMP_WAIT_POLICY', 'EXP_THREADS')


def spin() -> None:
    """Keep one core busy until terminated."""
    while True:
        pass


def run_trainer(env_extra: dict, epochs: int, root: Path, i: int) -> float:
    """Wall time in seconds of one trainer run in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    env.update(env_extra)
    cmd = [sys.executable, '-m', 'exp.train', '--epochs', str(epochs), '--out', str(root / f'r{i}')]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(rounds: int, epochs: int, load: int) -> dict:
    """Each setting's wall times over `rounds` interleaved rounds, beside `load` busy processes."""
    spinners = [mp.Process(target=spin, daemon=True) for _ in range(load)]
    for p in spinners:
        p.start()
    times = {name: [] for name in SETTINGS}
    try:
        with tempfile.TemporaryDirectory() as d:
            i = 0
            for _ in range(rounds):
                for name, extra in SETTINGS.items():
                    times[name].append(run_trainer(extra, epochs, Path(d), i))
                    i += 1
    finally:
        for p in spinners:
            p.terminate()
    return times


def main(argv=None) -> None:
    """Time the trainer under each thread setting, quiet and loaded, and print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=5, help='runs of each setting (default: 5)')
    p.add_argument('--epochs', type=int, default=3, help="the trainer's --epochs (default: 3)")
    p.add_argument(
        '--load', type=int, default=os.cpu_count(), help='busy processes (default: cores)'
    )
    args = p.parse_args(argv)
    print(f'cpus: {os.cpu_count()}  rounds: {args.rounds}  trainer epochs: {args.epochs}')
    for label, load in (('quiet', 0), (f'{args.load} busy processes beside it', args.load)):
        times = measure(args.rounds, args.epochs, load)
        print(f'-- {label}')
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f'{name}: median {med:.1f} s, min {min(ts):.1f}, max {max(ts):.1f}')


if __name__ == '__main__':
    main()

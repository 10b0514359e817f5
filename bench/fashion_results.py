"""Fashion-MNIST results of the trainer's ResNet recipes: each row the median of several seeds.

Runs `python -m exp.train --data fashion --arch resnet ...` once per seed and row, in a fresh
process each, and prints a Markdown table: the command, the seeds, each seed's test accuracy (the
last epoch's, on Fashion-MNIST's 10,000 test images; with test-time augmentation where the row asks
for it), the median, and each run's wall time; each run's metrics.csv goes to stderr. The figures
in `bench/README.md` come from it.

    python bench/fashion_results.py --rows 5ep --seeds 0 1 2
    python bench/fashion_results.py --rows 20ep-aug --seeds 0 1 2
    python bench/fashion_results.py --rows 20ep-aug 20ep-aug-ls --threads 1   # on a shared machine
    python bench/fashion_results.py --rows 20ep-aug-ls-lr2
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the rows of the results table: a name, and the trainer's options beyond --data and --arch
ROWS = {
    '5ep': ['--epochs', '5'],
    '20ep-aug': ['--epochs', '20', '--aug', 'crop,flip', '--tta'],
    '20ep-aug-erase': ['--epochs', '20', '--aug', 'crop,flip,erase', '--tta'],
    '20ep-aug-ls': ['--epochs', '20', '--aug', 'crop,flip', '--label-smoothing', '0.1', '--tta'],
    # course22p2's peak lr for its 50-epoch run, twice the 5-epoch recipe's
    '20ep-aug-ls-lr2': [
        *('--epochs', '20', '--aug', 'crop,flip', '--label-smoothing', '0.1'),
        *('--lr', '0.02', '--tta'),
    ],
    '20ep-erase-ls': [
        *('--epochs', '20', '--aug', 'crop,flip,erase', '--label-smoothing', '0.1'),
        '--tta',
    ],
    # the stretch: course22p2's 50-epoch run (erasing too, lr 0.02), in 40 epochs
    '40ep-erase-ls-lr2': [
        *('--epochs', '40', '--aug', 'crop,flip,erase', '--label-smoothing', '0.1'),
        *('--lr', '0.02', '--tta'),
    ],
}
ACCURACY = re.compile(r'^valid accuracy: ([0-9.]+)', re.M)
TTA = re.compile(r'^valid accuracy with test-time augmentation[^:]*: ([0-9.]+)', re.M)


def run(
    options: list[str], seed: int, out: Path, threads: int | None = None
) -> tuple[float, float | None, float]:
    """One trainer run: its accuracy, its accuracy with test-time augmentation (or None), and its
    wall time in seconds."""
    cmd = [sys.executable, '-m', 'exp.train', '--data', 'fashion', '--arch', 'resnet', *options]
    cmd += ['--seed', str(seed), '--out', str(out)]
    cmd += ['--threads', str(threads)] if threads else []
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    # each epoch's figures, kept with the table: the folder goes with the temporary one
    print(f"# seed {seed}: {out / 'metrics.csv'}", file=sys.stderr)
    print((out / 'metrics.csv').read_text(), file=sys.stderr, end='')
    tta = TTA.search(done.stdout)
    return float(ACCURACY.search(done.stdout)[1]), float(tta[1]) if tta else None, wall


def main(argv=None) -> None:
    """Run the rows asked for, seed by seed, and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rows', nargs='+', choices=list(ROWS), default=['5ep'], help='default: 5ep')
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2], help='default: 0 1 2')
    p.add_argument('--threads', type=int, help="torch threads (default: the trainer's)")
    args = p.parse_args(argv)
    threads = args.threads or "the trainer's default for the ResNet"
    print(f"cpus: {os.cpu_count()}, torch threads: {threads}\n")
    print('| command | seeds | test accuracy per seed | median | minutes per run |')
    print('|---|---|---|---|---|')
    with tempfile.TemporaryDirectory() as d:
        for name in args.rows:
            results = [
                run(ROWS[name], s, Path(d) / f'{name}-{s}', args.threads) for s in args.seeds
            ]
            accs = [tta if tta is not None else acc for acc, tta, _ in results]
            given = ['--threads', str(args.threads)] if args.threads else []
            cmd = ' '.join(
                ['python -m exp.train --data fashion --arch resnet', *ROWS[name], *given]
            )
            each = ', '.join(f'{a:.4f}' for a in accs)
            minutes = ', '.join(f'{w / 60:.1f}' for *_, w in results)
            seeds = ' '.join(map(str, args.seeds))
            row = f'| `{cmd}` | {seeds} | {each} | {statistics.median(accs):.4f} | {minutes} |'
            print(row, flush=True)


if __name__ == '__main__':
    main()

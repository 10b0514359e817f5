"""Checks of the benchmark scripts' own arithmetic and of their dry runs (no timing is asserted)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'bench'))
import fp16_gpu  # noqa: E402  (bench/ is not a package)
from fastcore import test as ft  # noqa: E402  (fastcore.test.test_eq would be collected by pytest as a test)


def reported(output: str) -> dict[str, str]:
    "The `name: value` lines a bench script printed, as a dict."
    return dict(line.split(': ', 1) for line in output.splitlines() if ': ' in line)


@pytest.mark.parametrize(
    'sizes, bs', [([784, 32, 32, 10], 16), ([5, 7, 3], 4), ([784, 64, 64, 64, 10], 9)]
)
def test_matmul_flops_per_step_is_what_torch_counts(sizes, bs, monkeypatch):
    """Our count of one training step's matrix-product FLOPs equals torch's FlopCounterMode over
    forward and backward."""
    monkeypatch.setattr(fp16_gpu, 'layer_sizes', lambda: sizes)
    monkeypatch.setattr(fp16_gpu, 'dev', torch.device('cpu'))
    model = fp16_gpu.make_model()
    x, y = torch.randn(bs, sizes[0]), torch.randint(0, sizes[-1], (bs,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    assert fp16_gpu.matmul_flops_per_step(sizes, bs) == counter.get_total_flops()


def test_the_h200_figure():
    """The MLP of fp16_gpu.py at 8.66 ms a step (ours, fp16, on the H200) ran at about 40% of the
    dense fp16 peak."""
    flops = fp16_gpu.matmul_flops_per_step([784, 8192, 8192, 8192, 10], 4096)
    assert abs(flops / 8.66e-3 / 1e12 / fp16_gpu.H200_FP16_DENSE_TFLOPS - 0.40) < 0.01


@pytest.mark.slow
def test_fp16_gpu_dry_run_on_cpu():
    "The GPU benchmark runs end to end on the CPU (a tiny model), the compiled contender included."
    proc = subprocess.run(
        [
            sys.executable,
            'bench/fp16_gpu.py',
            '--dry-run',
            '--only',
            'fp32',
            'ours_fp16',
            'ours_fp16_compiled',
            'amp_fp16',
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = reported(proc.stdout)
    for name in ('fp32', 'ours_fp16', 'ours_fp16_compiled', 'amp_fp16'):
        assert float(lines[f'{name}_step_ms']) > 0 and lines[f'{name}_of_fp16_peak'].endswith('%')
        # ten classes, three steps: near log(10) = 2.30
        assert 2.0 < float(lines[f'{name}_final_loss']) < 2.7
    assert 'ours_fp16_compiled_step_vs_ours_fp16' in lines


def test_fp16_gpu_goes_on_where_compiling_fails(monkeypatch, capsys):
    """Where torch.compile cannot run (no Triton on the GPU, no C++ compiler), the compiled run says
    why; the others run."""
    for name in ('WIDTH', 'DEPTH', 'BS', 'STEPS', 'WARMUP', 'dev'):
        monkeypatch.setattr(fp16_gpu, name, getattr(fp16_gpu, name))

    def no_backend(model, **kwargs):
        raise RuntimeError('Cannot find a working triton installation\n(more)')

    monkeypatch.setattr(torch, 'compile', no_backend)
    monkeypatch.setattr(
        sys, 'argv', ['fp16_gpu.py', '--dry-run', '--only', 'fp32', 'ours_fp16_compiled']
    )
    fp16_gpu.main()
    lines = reported(capsys.readouterr().out)
    ft.test_eq(
        lines['ours_fp16_compiled'],
        'not available (RuntimeError: Cannot find a working triton installation)',
    )
    assert float(lines['fp32_step_ms']) > 0 and 'ours_fp16_compiled_step_ms' not in lines


# ---------------- bench_overhead.py and peers.py


@pytest.fixture(scope='module')
def bench_overhead():
    """bench/bench_overhead.py as a module (its data loaded); it sets torch to one thread on import,
    put back here."""
    threads = torch.get_num_threads()
    import bench_overhead as module

    torch.set_num_threads(threads)
    return module


def test_report_ratio(bench_overhead, capsys):
    """The ratio is of the medians; the spread is over each round's own ratio; the overhead is per
    training batch."""
    bench_overhead.report_ratio('x', [1.10, 1.30, 1.02], [1.0, 1.2, 0.9], 1.05)
    bench_overhead.report_ratio('y', [1.10, 1.30, 1.02], [1.0, 1.2, 0.9], 1.2)
    lines = reported(capsys.readouterr().out)
    ft.test_eq(lines['x_epoch_s'], '1.1')
    ft.test_eq(lines['x_ratio'], '1.100')
    ft.test_eq(lines['x_ratio_spread'], '1.083-1.133')  # 1.30/1.2 and 1.02/0.9
    ft.test_close(
        float(lines['x_overhead_us_per_batch']), 0.1 / bench_overhead.N_BATCHES * 1e6, eps=0.05
    )
    ft.test_eq(lines['x_goal'], '<= 1.05 (missed)')
    ft.test_eq(lines['y_goal'], '<= 1.2 (met)')


def test_rounds_of_alternates(bench_overhead):
    "Each contender runs once to warm up, then once a round, the order flipping every round."
    calls = []
    times = bench_overhead.rounds_of(
        {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}, 3
    )
    ft.test_eq(calls, ['a', 'b', 'a', 'b', 'b', 'a', 'a', 'b'])
    ft.test_eq({name: len(ts) for name, ts in times.items()}, {'a': 3, 'b': 3})


def test_python_cost_helpers(bench_overhead):
    """--python-cost's function does its k iterations and nothing else; the hand loop calls it once
    per training batch."""
    ft.test_eq([bench_overhead.python_work(k)() for k in (0, 1, 30)], [0, 0, sum(range(30))])
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            bench_overhead,
            'train_ds',
            bench_overhead.Dataset(bench_overhead.x[:640], bench_overhead.y[:640]),
        )
        mp.setattr(
            bench_overhead,
            'valid_ds',
            bench_overhead.Dataset(bench_overhead.xv[:256], bench_overhead.yv[:256]),
        )
        bench_overhead.by_hand('mlp', lambda: calls.append(1))
    ft.test_eq(len(calls), 10)  # 640 samples in batches of 64; none for the validation batches


def _one_lr_off(exact):
    "`exact` (one_cycle_values) with the lr at batch 500 off by one part in a million."

    def values(arch):
        schedule = exact(arch)
        lr, mom = schedule[500]
        schedule[500] = (lr * (1 + 1e-6), mom)
        return schedule

    return values


@pytest.mark.slow
def test_same_work_mlp(bench_overhead, capsys):
    """fit_one_cycle and the hand loop end with the same weights and sums, to the last bit; one lr
    off at one batch is caught."""
    bench_overhead.same_work('mlp')
    lines = reported(capsys.readouterr().out)
    ft.test_eq(
        (lines['mlp_same_weights'], lines['mlp_same_stats'], lines['mlp_same_recording']),
        ('True', 'True', 'True'),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_overhead, 'one_cycle_values', _one_lr_off(bench_overhead.one_cycle_values))
        with pytest.raises(SystemExit, match='did not do the same work'):
            bench_overhead.same_work('mlp')
    from exp.anneal import Recorder

    # the same run, but the Recorder keeps nothing
    with bench_overhead.without([(Recorder, 'after_loss')]):
        with pytest.raises(SystemExit, match='did not do the same work'):
            bench_overhead.same_work('mlp')
    lines = reported(capsys.readouterr().out)
    ft.test_eq(
        (lines['mlp_same_weights'], lines['mlp_same_stats'], lines['mlp_same_recording']),
        ('True', 'True', 'False'),
    )


@pytest.mark.slow
def test_hand_loop_records_as_the_learner_does(bench_overhead):
    """by_hand(record=True) keeps an lr per group and the loss of each training batch, and stops at
    a loss that is not finite."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            bench_overhead,
            'train_ds',
            bench_overhead.Dataset(bench_overhead.x[:640], bench_overhead.y[:640]),
        )
        mp.setattr(
            bench_overhead,
            'valid_ds',
            bench_overhead.Dataset(bench_overhead.xv[:256], bench_overhead.yv[:256]),
        )
        _, _, (lrs, losses) = bench_overhead.by_hand('mlp', record=True)
        ft.test_eq((len(lrs), len(lrs[0]), len(losses)), (1, 10, 10))
        assert not any(l.requires_grad for l in losses)
        ft.test_eq(bench_overhead.by_hand('mlp')[2], None)
        bad = bench_overhead.x[:640].clone()
        bad[200] = float('nan')  # in one of the ten training batches, wherever the shuffle puts it
        mp.setattr(bench_overhead, 'train_ds', bench_overhead.Dataset(bad, bench_overhead.y[:640]))
        with pytest.raises(FloatingPointError, match='training loss nan'):
            bench_overhead.by_hand('mlp', record=True)


@pytest.mark.slow
def test_bounds_remove_the_handlers_and_put_them_back(bench_overhead):
    """--bounds: the handlers do nothing within the block and are back after it, error or not;
    without them the run is another."""
    from exp.anneal import ParamScheduler

    handler = ParamScheduler.begin_batch
    with bench_overhead.without(bench_overhead.BOUNDS['schedulers']):
        assert ParamScheduler.begin_batch is not handler
    ft.test_eq(ParamScheduler.begin_batch, handler)
    with pytest.raises(KeyError), bench_overhead.without(bench_overhead.BOUNDS['schedulers']):
        raise KeyError('inside')
    ft.test_eq(ParamScheduler.begin_batch, handler)
    model, *_ = bench_overhead.ours_without('schedulers', 'recorder_and_nan_check')()
    model2, *_ = bench_overhead.ours('mlp')
    # another lr: another run
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


@pytest.mark.slow
def test_fused_bound_does_the_same_work(bench_overhead):
    """--fused: FusedBound ends where fit_one_cycle does, to the last bit; one lr off at one batch
    is caught."""
    assert bench_overhead.fused_same_as_ours()
    with pytest.MonkeyPatch.context() as mp:
        # FusedBound's schedule only: ours has its own
        mp.setattr(bench_overhead, 'one_cycle_values', _one_lr_off(bench_overhead.one_cycle_values))
        assert not bench_overhead.fused_same_as_ours()


@pytest.mark.slow
def test_same_work_cnn(bench_overhead, capsys):
    "The same on the lesson's CNN, whose images come from a batch transform."
    bench_overhead.same_work('cnn')
    lines = reported(capsys.readouterr().out)
    ft.test_eq((lines['cnn_same_weights'], lines['cnn_same_stats']), ('True', 'True'))


def _tiny_data():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(96, 784, generator=g),
        torch.randint(0, 10, (96,), generator=g),
        torch.randn(40, 784, generator=g),
        torch.randint(0, 10, (40,), generator=g),
    )


def test_peers_that_cannot_run_are_reported(monkeypatch):
    """A peer that is not installed, or fails on its first run, is a reason (a string), not
    something to time."""
    import peers

    # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, 'lightning', None)

    def broken(*args):
        def run():
            raise RuntimeError('operator torchvision::nms does not exist\n(the traceback)')

        return run

    monkeypatch.setattr(peers, 'fastai', broken)
    out = peers.contenders(*_tiny_data(), 16, 0.1, (0.95, 0.85), 25.0, 0.3)
    ft.test_eq(list(out), ['plain_pytorch', 'lightning', 'fastai'])
    assert (
        out['lightning'].startswith('skipped (ModuleNotFoundError: ')
        and 'lightning' in out['lightning']
    )
    ft.test_eq(out['fastai'], 'skipped (RuntimeError: operator torchvision::nms does not exist)')
    # summed losses and counts of right answers, training then validation
    sums = out['plain_pytorch']()
    assert sums[0] > 0 and sums[2] > 0
    assert (
        0 <= sums[1] <= 96
        and 0 <= sums[3] <= 40
        and sums[1] == sums[1].round()
        and sums[3] == sums[3].round()
    )


# ---------------- overhead_counts.py


def test_overhead_counts_arithmetic(tmp_path):
    """A cachegrind file's totals are read by event name; an epoch is two runs less one; the cycle
    model weighs each event."""
    import overhead_counts

    out = tmp_path / 'cachegrind.out'
    out.write_text(
        'desc: I1 cache: 32768 B, 64 B, 8-way associative\ncmd: python x\n'
        'events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw Bc Bcm Bi Bim\nfl=a.c\nfn=f\n1 5 0 0 0 0 0 '
        '0 0 0 0 0 0 0\n'
        'summary: 1000 10 1 400 20 2 100 5 1 90 4 10 3\n'
    )
    once = overhead_counts.summary(out)
    ft.test_eq((once['Ir'], once['D1mw'], once['Bim']), (1000, 5, 3))
    twice = {k: 3 * v for k, v in once.items()}
    ft.test_eq(overhead_counts.per_epoch(once, twice), {k: 2 * v for k, v in once.items()})
    # last-level misses left out
    ft.test_eq(overhead_counts.est_cycles(once), 1000 + 12 * (10 + 20 + 5) + 15 * (4 + 3))
    out.write_text('events: Ir\n')
    with pytest.raises(ValueError, match='not a cachegrind output file'):
        overhead_counts.summary(out)


def test_overhead_counts_shortens_the_epoch(bench_overhead, monkeypatch):
    """--batches N: every contender's epoch is the first N training batches and as large a share of
    the validation set."""
    import overhead_counts

    for name in ('train_ds', 'valid_ds', 'N_BATCHES'):
        monkeypatch.setattr(bench_overhead, name, getattr(bench_overhead, name))
    overhead_counts.shorten(bench_overhead, 5)
    train_dl, _ = bench_overhead.loaders()
    ft.test_eq(
        (
            bench_overhead.N_BATCHES,
            len(train_dl),
            len(bench_overhead.train_ds),
            len(bench_overhead.valid_ds),
        ),
        (5, 5, 5 * 64, 5 * 64 // 6),
    )
    ft.test_eq(bench_overhead.train_ds.x, bench_overhead.x[: 5 * 64])
    # the schedule spans the shortened epoch
    ft.test_eq(len(bench_overhead.one_cycle_values('mlp')), 5)
    full = len(bench_overhead.x) // 64 + 1  # 938: the last batch of 60,000 is short
    monkeypatch.setattr(
        bench_overhead, 'train_ds', bench_overhead.Dataset(bench_overhead.x, bench_overhead.y)
    )
    monkeypatch.setattr(
        bench_overhead, 'valid_ds', bench_overhead.Dataset(bench_overhead.xv, bench_overhead.yv)
    )
    monkeypatch.setattr(bench_overhead, 'N_BATCHES', full)
    overhead_counts.shorten(bench_overhead, full)  # the whole epoch is a valid N
    ft.test_eq(
        (len(bench_overhead.train_ds), len(bench_overhead.valid_ds)),
        (len(bench_overhead.x), len(bench_overhead.xv)),
    )
    for bad in (0, full + 1):
        with pytest.raises(SystemExit, match='--batches must be in'):
            overhead_counts.shorten(bench_overhead, bad)


def test_overhead_counts_by_function(tmp_path):
    """Counts are summed by function (file without folders), short lines padded with zeros; the
    overhead is ours' epoch less the hand loop's."""
    import overhead_counts

    out = tmp_path / 'cachegrind.out'
    out.write_text(
        'events: Ir I1mr Bcm\nfl=/src/a.c\nfn=f\n1 5 1\n2 7\nfn=g\n3 2 0 4\nfl=???\nfn=???\n0 9 1 '
        '1\n'
        'fl=/other/a.c\nfn=f\n4 1\nsummary: 24 2 5\n'
    )
    ft.test_eq(
        overhead_counts.functions(out),
        {
            'a.c:f': {'Ir': 13, 'I1mr': 1, 'Bcm': 0},
            'a.c:g': {'Ir': 2, 'I1mr': 0, 'Bcm': 4},
            '???:???': {'Ir': 9, 'I1mr': 1, 'Bcm': 1},
        },
    )
    c = lambda ir: {'Ir': ir, 'I1mr': 0, 'Bcm': 0}
    hand1, hand2 = {'f': c(10)}, {'f': c(15), 'g': c(1)}  # the hand loop's epoch: f 5, g 1
    # ours': f 8, h 2, g 1
    ours1, ours2 = {'f': c(11), 'h': c(3)}, {'f': c(19), 'h': c(5), 'g': c(1)}
    ft.test_eq(
        overhead_counts.overhead_by_function(hand1, hand2, ours1, ours2),
        {'f': c(3), 'g': c(0), 'h': c(2)},
    )
    out.write_text('fn=f\n1 5\n')
    with pytest.raises(ValueError, match='not a cachegrind output file'):
        overhead_counts.functions(out)


def test_amp_resnet_steps_through_the_grad_scaler():
    """bench/amp_resnet.py's TorchAmp on the CPU (bfloat16 autocast, a GradScaler): the forward pass
    runs in bfloat16, the table and the Recorder keep the unscaled loss, the scaler steps the
    optimizer (the weights change, no step skipped) and the runner's own step is not taken too."""
    import amp_resnet
    from exp.callbacks import DataBunch
    from exp.learner import Learner
    from exp.minibatch import Dataset, get_dls
    from exp.optimizers import AdamW

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,))
    data = DataBunch(*get_dls(Dataset(x, y), Dataset(x[:32], y[:32]), 16), c=3)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(3)
    )
    model(x[:1])
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    learn = Learner(data, model, lr=1e-3, opt_func=AdamW, metrics=[])
    learn.display = 'off'
    before = [p.detach().clone() for p in model.parameters()]
    steps = []
    amp = amp_resnet.TorchAmp(torch.device('cpu'))
    step = learn.opt.step
    learn.opt.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
    learn.fit(1, cbs=[amp])
    assert set(seen) == {torch.bfloat16}
    assert len(steps) == len(data.train_dl)  # one step a batch: the scaler's, not a second one
    assert amp.scaler.get_scale() == 65536.0  # nothing overflowed, nothing skipped
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
    losses = [float(v) for v in learn.recorder.losses]
    assert max(losses) < 10, losses  # unscaled: a scaled loss would be about 65536 times larger

"""Tests for exp.distributed: the sampler against torch's DistributedSampler, the set-up's errors,
and real multi-process runs (torchrun, gloo on the CPU) against a single process over the same
global batches."""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st
from torch import nn
from torch.utils.data import DistributedSampler

from exp.callbacks import DataBunch, Learner
from exp.distributed import (
    ENV_VARS,
    BatchShareSampler,
    DistributedCallback,
    ShardedSampler,
    launch,
    rank_lines,
    torchrun_env,
)
from exp.minibatch import Dataset, Sampler, get_dls
from tools.notebooks import NBS

WORKER = Path(__file__).with_name('dist_worker.py')
# exp.train would take a GPU per process: two processes need two GPUs
CPU_ONLY = {'CUDA_VISIBLE_DEVICES': ''}


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 120),
    world=st.integers(1, 9),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    epoch=st.integers(0, 50),
    bs=st.integers(1, 20),
)
def test_sharded_sampler_equals_torchs(n, world, shuffle, drop_last, seed, epoch, bs):
    if drop_last and n < world:
        return  # no sample for some rank: refused (tested below)
    for rank in range(world):
        ours = ShardedSampler(
            range(n), bs, world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        theirs = DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        batches = list(ours)
        ft.test_eq(len(batches), len(ours))
        assert all(len(b) == bs for b in batches[:-1]) and 0 < len(batches[-1]) <= bs
        ft.test_eq(torch.cat(batches).tolist(), list(theirs))


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 100),
    world=st.integers(1, 6),
    local_bs=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_ranks_together_take_the_global_batches(n, world, local_bs, seed):
    """Batch i of every rank, together, is batch i of one process reading the same permutation in
    batches of world * bs."""
    # with padding the union holds repeats; without, it is exact
    if n % world:
        n += world - n % world
    one = list(ShardedSampler(range(n), local_bs * world, 1, 0, seed=seed))
    per_rank = [list(ShardedSampler(range(n), local_bs, world, r, seed=seed)) for r in range(world)]
    assert all(len(p) == len(one) for p in per_rank)
    for i, batch in enumerate(one):
        ft.test_eq(sorted(torch.cat([p[i] for p in per_rank]).tolist()), sorted(batch.tolist()))


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 100),
    world=st.integers(1, 6),
    local_bs=st.integers(1, 8),
    seed=st.integers(0, 1000),
    drop_last=st.booleans(),
)
def test_batch_shares_are_the_single_process_batches(n, world, local_bs, seed, drop_last):
    """BatchShareSampler: the shares of batch i, together, are batch i of the one Sampler, epoch
    after epoch; sizes differ by <= 1."""
    bs = local_bs * world
    if drop_last and n < bs:
        return  # no batch at all
    if not drop_last and 0 < n % bs < world:
        ft.test_fail(
            lambda: BatchShareSampler(Sampler(range(n), bs), world, 0),
            contains='too few to give each',
        )
        return
    one = Sampler(range(n), bs, shuffle=True, drop_last=drop_last, seed=seed)
    shares = [
        BatchShareSampler(
            Sampler(range(n), bs, shuffle=True, drop_last=drop_last, seed=seed), world, r
        )
        for r in range(world)
    ]
    # what a checkpoint saves: the one sampler's shuffling
    assert all(s.generator is s.sampler.generator for s in shares)
    for epoch in range(2):
        batches, parts = list(one), [list(s) for s in shares]
        assert all(len(p) == len(batches) == len(s) for p, s in zip(parts, shares))
        for i, batch in enumerate(batches):
            ft.test_eq(sorted(torch.cat([p[i] for p in parts]).tolist()), sorted(batch.tolist()))
            sizes = [len(p[i]) for p in parts]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) > 0


def test_batch_share_sampler_refuses_bad_arguments():
    s = Sampler(range(10), 4)
    ft.test_fail(
        lambda: BatchShareSampler(ShardedSampler(range(10), 4, 1, 0), 2, 0),
        contains='must be an exp.minibatch Sampler',
    )
    ft.test_fail(lambda: BatchShareSampler(s, 0, 0), contains='num_replicas must be a positive int')
    ft.test_fail(lambda: BatchShareSampler(s, 2, 2), contains='rank must be an int in [0, 2)')
    ft.test_fail(
        lambda: BatchShareSampler(s, 3, 0),
        contains='holds 2: too few to give each of 3 processes one',
    )


@pytest.mark.parametrize('n,world', [(13, 3), (5, 8), (10, 5), (1, 2)])
def test_uneven_shards_hold_each_sample_once(n, world):
    shards = [
        ShardedSampler(range(n), 4, world, r, shuffle=False, even=False).indices().tolist()
        for r in range(world)
    ]
    ft.test_eq(sorted(sum(shards, [])), list(range(n)))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_sharded_sampler_refuses_bad_arguments():
    ft.test_fail(lambda: ShardedSampler(range(10), 0, 2, 0), contains='bs must be a positive int')
    ft.test_fail(
        lambda: ShardedSampler(range(10), 4, 0, 0), contains='num_replicas must be a positive int'
    )
    ft.test_fail(
        lambda: ShardedSampler(range(10), 4, 2, 2), contains='rank must be an int in [0, 2)'
    )
    ft.test_fail(
        lambda: ShardedSampler(range(10), 4, 2, 0, seed=1.5), contains='seed must be an int'
    )
    ft.test_fail(
        lambda: ShardedSampler(range(10), 4, 2, 0, drop_last=True, even=False),
        contains='needs even=True',
    )
    ft.test_fail(
        lambda: ShardedSampler(range(3), 4, 4, 0, drop_last=True),
        contains='cannot be shared evenly by 4',
    )


def toy_learner(bs=32, n=100):
    ds = Dataset(torch.randn(n, 5), torch.randint(0, 2, (n,)))
    return Learner(DataBunch(*get_dls(ds, ds, bs), c=2), nn.Linear(5, 2))


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for k in ENV_VARS:
        monkeypatch.delenv(k, raising=False)


def test_without_torchrun_says_how_to_launch(no_torchrun_env):
    assert torchrun_env() is None
    ft.test_fail(
        lambda: toy_learner().to_distributed(), contains='launch with `torchrun --nproc_per_node N'
    )


def torchrun_vars(monkeypatch, rank=0, world=3):
    for k, v in dict(
        RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world, MASTER_ADDR='localhost', MASTER_PORT=1
    ).items():
        monkeypatch.setenv(k, str(v))


def test_batch_that_does_not_split_is_refused_before_joining(monkeypatch):
    # no process to meet: to_distributed must refuse before it tries
    torchrun_vars(monkeypatch, world=3)
    ft.test_fail(
        lambda: toy_learner(bs=32).to_distributed(),
        contains='the batch size 32 does not split evenly over 3',
    )
    ft.test_fail(
        lambda: toy_learner(bs=3, n=2).to_distributed(),
        contains='2 training samples cannot be shared by 3',
    )
    ft.test_fail(
        lambda: toy_learner(bs=3).to_distributed(timeout=0),
        contains='timeout must be a number of seconds > 0',
    )
    ft.test_fail(lambda: toy_learner(bs=3).to_distributed(seed=1.5), contains='seed must be an int')
    ft.test_fail(
        lambda: toy_learner(bs=6, n=103).to_distributed(),
        contains='holds 1: too few to give each of 3',
    )
    monkeypatch.setenv('RANK', 'x')
    ft.test_fail(
        lambda: toy_learner(bs=3).to_distributed(), contains="torchrun's variables must be integers"
    )


def test_lr_finder_is_refused_on_a_distributed_learner():
    learn = toy_learner()
    learn.display = 'off'
    # its begin_fit refuses before any collective operation
    learn.cbs.append(DistributedCallback(0, 2))
    ft.test_fail(lambda: learn.lr_find(max_iter=5), contains='LR finder cannot run data-parallel')


def results(folder: Path, rank: int) -> dict:
    return json.loads((folder / f'rank{rank}.json').read_text())


@pytest.fixture(scope='module')
def single_run(tmp_path_factory):
    "The reference: the same script in one process, without torch.distributed."
    out = tmp_path_factory.mktemp('single')
    subprocess.run(
        [sys.executable, str(WORKER), str(out)], check=True, capture_output=True, timeout=300
    )
    return out


def test_two_processes_train_like_one(single_run, tmp_path, no_torchrun_env):
    """Seed 0, 3 epochs of one-cycle, a last batch split 12 + 11: weights within 1e-6; ranks report
    identical numbers."""
    out = launch(WORKER, tmp_path, nproc=2, timeout=300).stdout
    one = torch.load(single_run / 'model.pth', weights_only=True)['model']
    two = torch.load(tmp_path / 'model.pth', weights_only=True)['model']
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    assert diff < 1e-6, diff
    r0, r1, ref = results(tmp_path, 0), results(tmp_path, 1), results(single_run, 0)
    ft.test_eq(r0, r1)  # identical: all-reduced statistics, every rank computes the same averages
    ft.test_eq((r0['world_size'], ref['world_size']), (2, 1))
    for row, ref_row in zip(r0['history'] + [r0['validate']], ref['history'] + [ref['validate']]):
        for k in row:
            assert abs(row[k] - ref_row[k]) < 1e-6, (k, row[k], ref_row[k])
    # rank 0 saves
    ft.test_eq(
        sorted(p.name for p in tmp_path.iterdir()), ['model.pth', 'rank0.json', 'rank1.json']
    )
    tables = [[l for l in rank_lines(out, rank) if 'valid_accuracy' in l] for rank in (0, 1)]
    # the table's header: rank 0 logs it, rank 1's logger is silent
    ft.test_eq([len(t) for t in tables], [1, 0])


def test_two_processes_in_mixed_precision(tmp_path, no_torchrun_env):
    """MixedPrecision under DDP: the processes skip the same steps and keep the same loss scale and
    statistics."""
    launch(WORKER, tmp_path, '--fp16', nproc=2, timeout=300)
    r0, r1 = results(tmp_path, 0), results(tmp_path, 1)
    ft.test_eq(r0, r1)
    # the default first scale overflowed, in both alike
    assert r0['loss_scale'] < 2.0**16 and r0['skipped'] > 0
    state = torch.load(tmp_path / 'model.pth', weights_only=True)['model']
    assert all(
        v.dtype == torch.float32 and v.isfinite().all()
        for v in state.values()
        if v.is_floating_point()
    )
    # 600 samples, 3 epochs: it learns (the fp32 run reaches ~0.8)
    assert r0['history'][-1]['valid_accuracy'] > 0.6


def test_a_dying_rank_stops_the_run(tmp_path, no_torchrun_env):
    proc = launch(WORKER, tmp_path, '--die-at', 1, nproc=2, timeout=120, check=False)
    assert proc.returncode != 0
    assert 'dying on purpose' in proc.stderr
    # rank 0 did not finish as if nothing had happened
    assert not (tmp_path / 'rank0.json').exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict:
    """The environment torchrun gives process `rank` of `world`, meeting at 127.0.0.1:`port`, on one
    thread; `extra` on top."""
    return {
        **os.environ,
        'RANK': str(rank),
        'LOCAL_RANK': str(rank),
        'WORLD_SIZE': str(world),
        'MASTER_ADDR': '127.0.0.1',
        'MASTER_PORT': str(port),
        'OMP_NUM_THREADS': '1',
        **extra,
    }


def by_hand(
    args, port: int, world: int = 2, extra_env: dict | None = None
) -> list[subprocess.Popen]:
    """The worker in `world` processes started by hand (no torchrun watching them), meeting at
    127.0.0.1:`port`."""
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), *map(str, args)],
            env=rank_env(r, world, port, **(extra_env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]


OPERATION = {
    'batch': 'rank 0: the gradient all-reduce (DDP, in backward) of epoch 1, batch 2 failed',
    'broadcast': 'rank 0: broadcasting the model failed',
    'validation': 'rank 0: summing the statistics of epoch 1 failed',
}


@pytest.mark.parametrize('at', ['batch', 'broadcast', 'validation'])
@pytest.mark.parametrize('fault', ['raise', 'kill', 'hang'])
def test_a_failing_peer_is_a_distributed_error(fault, at, tmp_path, no_torchrun_env):
    """Rank 1 raises, is SIGKILLed or hangs (3 s timeout), without torchrun's watch: rank 0 ends
    with one DistributedError naming it."""
    procs = by_hand([tmp_path, '--fault', fault, '--at', at, '--timeout', 3], free_port())
    try:
        _, err = procs[0].communicate(timeout=90)  # a hang: the 3 s timeout, not the 300 s default
        if fault == 'raise':
            _, peer_err = procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    # an exception, not a signal: no SIGABRT at exit
    assert procs[0].returncode == 1, (procs[0].returncode, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert (
        f"exp.elastic.DistributedError: {OPERATION[at]}: another process died, hung or did "
        "not answer within the 3 s timeout ("
    ) in last, err[-3000:]
    assert 'terminate called' not in err
    assert not (tmp_path / 'rank0.json').exists()
    if fault == 'raise':  # the failing process leaves cleanly too: its error, and no abort at exit
        ft.test_eq(procs[1].returncode, 1)
        assert (
            'RuntimeError: rank 1: failing on purpose' in peer_err
            and 'terminate called' not in peer_err
        ), peer_err[-2000:]


LEAVE = """
import os, torch
from torch import nn
from exp.distributed import join_group, shutdown
from torch.nn.parallel import DistributedDataParallel
def threads():
    tasks = os.listdir('/proc/self/task')
    return sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in tasks)
join_group('gloo', 5.)
ddp = DistributedDataParallel(nn.Linear(3, 2))
ddp(torch.randn(4, 3)).sum().backward()
print('joined:', threads())
del ddp
shutdown()
print('left:', threads())
"""


@pytest.mark.skipif(
    not Path('/proc/self/task').is_dir(), reason="lists the process's threads from Linux's /proc"
)
def test_leaving_the_group_ends_the_gloo_threads(no_torchrun_env):
    """After a DDP step, shutdown() ends gloo's threads: none may outlive the interpreter (that
    ended in SIGABRT at exit)."""
    proc = subprocess.run(
        [sys.executable, '-c', LEAVE],
        env=rank_env(0, 1, free_port()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    ft.test_eq(proc.returncode, 0)
    joined, left = (
        line for line in proc.stdout.splitlines() if line.startswith(('joined:', 'left:'))
    )
    assert 'gloo' in joined, joined  # the check sees gloo's threads while the group exists
    assert 'gloo' not in left, left


THREADS_LEFT = """
import os
print('left:', sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in
os.listdir('/proc/self/task')))
"""


def notebook_scripts(name: str) -> dict[str, str]:
    """The scripts a notebook writes with `script('''...''', 'name.py')`, by name, dedented as it
    writes them."""
    cells = json.loads((NBS / name).read_text(encoding='utf-8'))['cells']
    code = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'code')
    return {
        m[2]: textwrap.dedent(m[1])
        for m in re.finditer(r"script\(\s*'''(.*?)''',\s*'(\w+\.py)',?\s*\)", code, re.S)
    }


@pytest.mark.skipif(
    not Path('/proc/self/task').is_dir(), reason="lists the process's threads from Linux's /proc"
)
def test_the_lessons_plain_scripts_end_their_gloo_threads(tmp_path, no_torchrun_env):
    """The plain-torch scripts of notebooks 12 and A6 destroy their group for good: gloo's threads
    left at exit could abort it (SIGABRT)."""
    # the lesson's scripts, and its appendix's (A6 builds the operations on top of them)
    written = {
        **notebook_scripts('12_distributed.ipynb'),
        **notebook_scripts('A6_elastic.ipynb'),
    }
    scripts = {k: v for k, v in written.items() if 'dist.destroy_process_group()' in v}
    assert {'hello.py', 'by_hand.py', 'ddp.py'} <= set(scripts), sorted(scripts)
    for name, code in scripts.items():
        (tmp_path / name).write_text(code + THREADS_LEFT)
        out = launch(tmp_path / name, nproc=2, env=CPU_ONLY).stdout
        for rank in (0, 1):
            left = [line for line in rank_lines(out, rank) if line.startswith('left:')]
            ft.test_eq(len(left), 1)
            # the threads are named 'pt_gloo_runloop', 'gloo_tcp_loop'
            assert 'gloo' not in left[0], (name, left[0])


SYNC = """
import json, sys, torch
from torch import nn
from exp.batchnorm import BatchNorm2d, RunningBatchNorm
import torch.distributed as dist
from exp.distributed import _sync_buffers, join_group, shutdown
join_group('gloo', 10.)
rank = dist.get_rank()
model = nn.Sequential(nn.Conv2d(1, 3, 3), BatchNorm2d(3), RunningBatchNorm(3))
with torch.no_grad():  # buffers of every dtype, different on each rank
    for b in model.buffers(): b.fill_(rank + 1 if b.is_floating_point() else 10 * (rank + 1))
_sync_buffers(model)
print(json.dumps({name: b.tolist() for name, b in model.named_buffers()}))
shutdown()
"""


def test_rank_0s_buffers_reach_every_rank(tmp_path, no_torchrun_env):
    """What DistributedCallback does before each training batch: every rank's buffers become rank
    0's, whatever their dtype."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, '-c', SYNC],
            env=rank_env(r, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        ft.test_eq((p.returncode, err[-2000:] if p.returncode else ''), (0, ''))
    bufs = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    ft.test_eq(bufs[1], bufs[0])
    ft.test_eq(
        sorted(bufs[0]),
        [
            '1.num_batches_tracked',
            '1.running_mean',
            '1.running_var',
            '2.count',
            '2.seen',
            '2.sqrs',
            '2.sums',
        ],
    )
    ft.test_eq(
        (bufs[0]['1.running_mean'], bufs[0]['1.num_batches_tracked'], bufs[0]['2.seen']),
        ([1.0] * 3, 10, 10),
    )


def test_an_unreachable_rendezvous_fails_within_the_timeout(tmp_path, no_torchrun_env):
    """Rank 1 of 2 with nobody at MASTER_ADDR:MASTER_PORT: one DistributedError after the 3 s
    timeout, not 300 s."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path), '--timeout', '3'],
        env=rank_env(1, 2, free_port()),
        capture_output=True,
        text=True,
        timeout=90,
    )
    ft.test_eq(proc.returncode, 1)
    assert 'DistributedError: rank 1: joining the process group at 127.0.0.1:' in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert 'within the 3 s timeout' in proc.stderr


def test_exp_train_under_torchrun(tmp_path, no_torchrun_env):
    out = tmp_path / 'run'
    proc = launch(
        '-m',
        'exp.train',
        '--arch',
        'mlp',
        '--epochs',
        2,
        '--out',
        out,
        nproc=2,
        timeout=300,
        env=CPU_ONLY,
    )
    ft.test_eq(rank_lines(proc.stdout, 1), [])  # rank 1 trains silently
    lines = rank_lines(proc.stdout, 0)
    assert ', 2 processes;' in lines[0] and sum('valid accuracy:' in l for l in lines) == 1
    ft.test_eq(
        sorted(p.name for p in out.iterdir()),
        ['config.json', 'loss.png', 'lr.png', 'metrics.csv', 'model.pth'],
    )
    ft.test_eq(len((out / 'metrics.csv').read_text().splitlines()), 3)
    ft.test_eq([p.name for p in tmp_path.iterdir()], ['run'])  # no partial folder left by any rank


def test_exp_train_keeps_the_run_when_a_peer_dies(tmp_path, no_torchrun_env):
    """Rank 1 dies early in epoch 1: rank 0 keeps the partial folder with epoch 0's checkpoint and
    says how to go on."""
    fault = Path(__file__).parent / 'fault_train.py'
    proc = launch(
        fault,
        tmp_path / 'unused',
        'die-rank1',
        '--arch',
        'mlp',
        '--epochs',
        3,
        '--out',
        tmp_path / 'run',
        nproc=2,
        timeout=300,
        env=CPU_ONLY,
        check=False,
    )
    assert proc.returncode != 0
    lines = [l for l in rank_lines(proc.stderr, 0) if 'exp.train: error:' in l]
    ft.test_eq(len(lines), 1)
    assert (
        f'the run so far is in {tmp_path / "run.partial"} (its checkpoint: epoch 0' in lines[0]
    ), lines[0]
    assert lines[0].endswith(
        'continue it with: torchrun --standalone --nproc-per-node 2 -m exp.train --resume '
        f'{tmp_path / "run.partial"}'
    ), lines[0]
    ft.test_eq(torch.load(tmp_path / 'run.partial' / 'model.pth', weights_only=True)['epoch'], 0)
    assert not (tmp_path / 'run').exists()


def test_exp_train_under_torchrun_refuses_a_batch_that_does_not_split(tmp_path, no_torchrun_env):
    proc = launch(
        '-m',
        'exp.train',
        '--arch',
        'mlp',
        '--bs',
        33,
        '--out',
        tmp_path / 'run',
        nproc=2,
        timeout=120,
        check=False,
        env=CPU_ONLY,
    )
    assert proc.returncode != 0
    assert (
        'exp.train: error: the batch size 33 does not split evenly over 2 processes' in proc.stderr
    )
    assert 'exp.train: error: [rank 1] the batch size 33' in proc.stderr
    assert not (tmp_path / 'run').exists()


def test_exp_train_with_half_of_torchruns_environment_says_how_to_launch(tmp_path, no_torchrun_env):
    proc = subprocess.run(
        [sys.executable, '-m', 'exp.train', '--out', str(tmp_path / 'run')],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, 'WORLD_SIZE': '2'},
    )
    ft.test_eq(proc.returncode, 2)
    ft.test_eq(len(proc.stderr.strip().splitlines()), 1)
    assert (
        'RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set' in proc.stderr
        and 'torchrun' in proc.stderr
    )
    assert not (tmp_path / 'run').exists()


# 4 epochs of the embedded digits, no batch norm
TRAIN = ('-m', 'exp.train', '--arch', 'mlp', '--epochs', 4, '--seed', 0)
FAULT = Path(__file__).parent / 'fault_train.py'


def weights(run: Path) -> dict:
    return torch.load(run / 'model.pth', weights_only=True)['model']


def max_diff(a: dict, b: dict) -> float:
    ft.test_eq(sorted(a), sorted(b))
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope='module')
def two_process_run(tmp_path_factory):
    "The reference: exp.train on two processes, uninterrupted."
    out = tmp_path_factory.mktemp('two') / 'run'
    launch(*TRAIN, '--out', out, nproc=2, timeout=300, env=CPU_ONLY)
    return out


def test_exp_train_is_one_run_whatever_the_world_size(two_process_run, tmp_path, no_torchrun_env):
    """The same options in one process (no torchrun) and on two: the same global batches, weights
    within 1e-5."""
    out = tmp_path / 'run'
    subprocess.run(
        [sys.executable, *map(str, TRAIN), '--out', str(out)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, **CPU_ONLY, 'OMP_NUM_THREADS': '1'},
    )
    diff = max_diff(weights(out), weights(two_process_run))
    assert diff < 1e-5, diff
    one, two = ((r / 'metrics.csv').read_text().splitlines() for r in (out, two_process_run))
    ft.test_eq(len(one), 5)
    # the table too: valid_accuracy exactly, the losses within 1e-5
    for a, b in zip(one[1:], two[1:]):
        a, b = a.split(',')[:-1], b.split(',')[:-1]  # the time column differs
        assert all(abs(float(x) - float(y)) < 1e-5 for x, y in zip(a, b)), (a, b)


def test_an_elastic_restart_resumes_the_run(two_process_run, tmp_path, no_torchrun_env):
    """torchrun --max-restarts 1; rank 1 SIGKILLed in epoch 2: the restarted workers resume from
    epoch 1's checkpoint."""
    out = tmp_path / 'run'
    # torchrun's agent looks at its workers every 0.1 s and SIGTERMs the others once one has died:
    # rank 0 names the failed all-reduce if that surfaces first, else it was "stopped by SIGTERM"
    # (on a busy machine, now and then). Both keep the run. Looking every 3 s (PET_MONITOR_INTERVAL
    # is torchrun's --monitor-interval) makes the first the rule.
    proc = launch(
        FAULT,
        tmp_path / 'unused',
        'kill-rank1',
        *TRAIN[2:],
        '--out',
        out,
        nproc=2,
        max_restarts=1,
        timeout=300,
        env={**CPU_ONLY, 'PET_MONITOR_INTERVAL': '3'},
        check=False,
    )
    ft.test_eq(proc.returncode, 0)
    lines = rank_lines(proc.stdout, 0)
    # the second attempt went on, not from epoch 0
    assert sum('resuming at epoch 2' in l for l in lines) == 1, lines
    errors = [l for l in rank_lines(proc.stderr, 0) if 'exp.train: error:' in l]
    # the first attempt's rank 0: one line, naming the operation (or torchrun's signal)
    ft.test_eq(len(errors), 1)
    assert (
        'rank 0: the gradient all-reduce (DDP, in backward) of epoch 2, batch 9 failed' in errors[0]
        or 'stopped by SIGTERM, during epoch 2;' in errors[0]
    ), errors
    assert 'torchrun restarts the workers, which go on from there (1 restart left)' in errors[0]
    rows = (out / 'metrics.csv').read_text().splitlines()
    ft.test_eq([r.split(',')[0] for r in rows], ['epoch', '0', '1', '2', '3'])  # each epoch once
    diff = max_diff(weights(out), weights(two_process_run))
    assert diff < 1e-6, diff
    ft.test_eq(sorted(p.name for p in tmp_path.iterdir()), ['run'])  # no partial folder left


def test_two_nodes_train_like_two_processes(two_process_run, tmp_path, no_torchrun_env):
    """Two torchrun agents (--nnodes 2, c10d rendezvous on 127.0.0.1), one process each: the same
    weights, within 1e-5."""
    out, port = tmp_path / 'run', free_port()
    cmd = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--nnodes',
        '2',
        '--nproc-per-node',
        '1',
        '--rdzv-backend',
        'c10d',
        '--rdzv-endpoint',
        f'127.0.0.1:{port}',
        '--rdzv-id',
        'two-nodes',
        *map(str, TRAIN),
        '--out',
        str(out),
    ]
    env = {**os.environ, **CPU_ONLY, 'OMP_NUM_THREADS': '1'}
    nodes = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        results = [n.communicate(timeout=300) for n in nodes]
    finally:
        for n in nodes:
            n.kill()
            n.communicate()
    ft.test_eq([n.returncode for n in nodes], [0, 0])
    # one node's worker is rank 0: it alone reports
    assert sum('2 processes;' in o for o, _ in results) == 1
    diff = max_diff(weights(out), weights(two_process_run))
    assert diff < 1e-5, diff


def test_exp_train_dist_timeout_bounds_an_unreachable_rendezvous(tmp_path, no_torchrun_env):
    """exp.train as rank 1 of 2 with nobody at MASTER_ADDR:MASTER_PORT and --dist-timeout 3: one
    line, exit 2, nothing written."""
    env = rank_env(1, 2, free_port(), **CPU_ONLY)
    proc = subprocess.run(
        [
            sys.executable,
            '-m',
            'exp.train',
            '--arch',
            'mlp',
            '--dist-timeout',
            '3',
            '--out',
            str(tmp_path / 'run'),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    ft.test_eq(proc.returncode, 2)
    lines = proc.stderr.strip().splitlines()
    ft.test_eq(len(lines), 1)
    assert lines[0].startswith(
        'exp.train: error: [rank 1] rank 1: joining the process group at 127.0.0.1:'
    ), lines
    assert 'within the 3 s timeout' in lines[0]
    ft.test_eq(list(tmp_path.iterdir()), [])


def test_exp_train_hung_peer_is_one_line_after_the_dist_timeout(tmp_path, no_torchrun_env):
    """torchrun, rank 1 stopped (SIGSTOP) in epoch 1, --dist-timeout 5: rank 0's one line names the
    operation and the timeout."""
    proc = launch(
        FAULT,
        tmp_path / 'unused',
        'stop-rank1',
        '--arch',
        'mlp',
        '--epochs',
        3,
        '--dist-timeout',
        5,
        '--out',
        tmp_path / 'run',
        nproc=2,
        timeout=300,
        env=CPU_ONLY,
        check=False,
    )
    assert proc.returncode != 0
    lines = [l for l in rank_lines(proc.stderr, 0) if 'exp.train: error:' in l]
    ft.test_eq(len(lines), 1)
    assert (
        'DistributedError: rank 0: the gradient all-reduce (DDP, in backward) of epoch 1, batch 4 '
        'failed' in lines[0]
    ), lines
    assert (
        'within the 5 s timeout' in lines[0]
        and f'the run so far is in {tmp_path / "run.partial"}' in lines[0]
    )

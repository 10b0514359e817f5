"""Mixed precision on a GPU: the same MLP trained by the same Runner in fp32 (TF32 off), TF32, our
MixedPrecision (fp16, and bf16), ours in fp16 with the model under torch.compile, and torch.amp
(autocast + GradScaler for fp16; autocast for bf16). Prints samples/s, the ratios, peak memory and
the final loss of each, and the matrix multiplications' achieved TFLOP/s with their fraction of the
H200's dense fp16 peak (989 TFLOP/s; `--peak-tflops` for another GPU). Goals: ours at least 2x fp32,
and within 1.15x of torch.amp's step time. Needs CUDA; takes about a minute on one H200 (the
compiled run adds its compilation, untimed).

`--dry-run` runs every contender on the CPU with a tiny model and batch (fp16 and the compiled run
included), to check the script itself on a machine without a GPU: its figures mean nothing."""

import argparse
import gc
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.fp16 import to_bf16, to_fp16
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD

WIDTH, DEPTH, BS, STEPS, WARMUP = 8192, 3, 4096, 30, 5
# NVIDIA's figure for H100/H200 SXM tensor cores, fp16/bf16, without sparsity
H200_FP16_DENSE_TFLOPS = 989.0
dev = torch.device('cuda')


def report(name, value):
    print(f'{name}: {value}', flush=True)


def make_data(steps):
    g = torch.Generator(device=dev).manual_seed(0)
    n = BS * steps
    x = torch.randn(n, 784, device=dev, generator=g)
    teacher = torch.randn(784, 10, device=dev, generator=g)
    y = (x @ teacher).argmax(1)  # labels a model can learn, so the final losses say something
    train_ds, valid_ds = Dataset(x, y), Dataset(x[:BS], y[:BS])
    return DataBunch(
        DataLoader(train_ds, Sampler(train_ds, BS, shuffle=True, seed=0)),
        DataLoader(valid_ds, Sampler(valid_ds, BS)),
        c=10,
    )


def layer_sizes() -> list:
    "The widths of the MLP's layers, input to output."
    return [784] + [WIDTH] * DEPTH + [10]


def make_model():
    torch.manual_seed(0)
    layers, sizes = [], layer_sizes()
    for n_in, n_out in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1])).to(dev)


def matmul_flops_per_step(sizes: list, bs: int) -> int:
    """Floating-point operations of the linear layers' matrix products in one training step of an
    MLP with layer widths `sizes` at batch size `bs`: 2*bs*n_in*n_out for the forward product, as
    much for the weight gradient, and as much for the input gradient, which the first layer does not
    need (its input has none). Batch norm, ReLU, the loss and the optimizer are left out:
    elementwise, they are a fraction of a percent."""
    return sum(
        2 * bs * n_in * n_out * (2 if i == 0 else 3)
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]))
    )


class _ScaledOptimizer:
    "An optimizer whose step goes through a GradScaler, as torch.amp's recipe has it."

    def __init__(self, opt, scaler):
        self.opt, self.scaler, self.param_groups = opt, scaler, opt.param_groups

    def step(self):
        self.scaler.step(self.opt)
        self.scaler.update()

    def zero_grad(self):
        self.opt.zero_grad()


class TorchAmp(Callback):
    "torch.amp as a Runner callback: autocast around forward and loss; GradScaler for fp16."

    _order = 99

    def __init__(self, dtype):
        self.dtype = dtype

    def begin_fit(self):
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.dtype == torch.float16)
        self.plain_opt = self.learn.opt
        self.learn.opt = _ScaledOptimizer(self.plain_opt, self.scaler)

    def begin_batch(self):
        self.autocast = torch.autocast(dev.type, dtype=self.dtype)
        self.autocast.__enter__()

    def after_loss(self):
        self.autocast.__exit__(None, None, None)
        if self.in_train:
            self.unscaled_loss = self.loss
            self.run.loss = self.scaler.scale(self.loss)

    def after_backward(self):
        self.run.loss = self.unscaled_loss

    def after_fit(self):
        self.learn.opt = self.plain_opt


def synchronize():
    if dev.type == 'cuda':
        torch.cuda.synchronize()


class Timer(Callback):
    "Wall time of the training batches (synchronised), and the last training loss."

    _order = 200

    def begin_fit(self):
        self.train_time, self.loss_value = 0.0, float('nan')

    def begin_epoch(self):
        synchronize()
        self.t0 = time.perf_counter()

    def begin_validate(self):
        synchronize()
        self.train_time += time.perf_counter() - self.t0
        self.loss_value = self.loss.float().item()


def contender(setup, tf32=False, compiled=False):
    """Train with the callbacks `setup(learn)` adds, after a warm-up fit (which also compiles, for
    `compiled`); the figures."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    # what earlier contenders left (a Learner and its callbacks refer to each other: only the cycle
    # collector frees them; the compiler's caches hold the compiled model) freed first, so that each
    # peak is this run's alone
    gc.collect()
    torch._dynamo.reset()
    base = torch.cuda.memory_allocated() if dev.type == 'cuda' else 0
    model = make_model()
    learn = Learner(
        make_data(STEPS),
        model,
        F.cross_entropy,
        lr=0.01,
        opt_func=lambda ps, lr: SGD(ps, lr=lr, momentum=0.9),
    )
    extra = setup(learn)
    # the same parameters: the optimizer and the masters see them
    if compiled:
        learn.model = torch.compile(model)
    warm = Learner(make_data(WARMUP), learn.model, F.cross_entropy)
    warm.opt, warm.cbs = learn.opt, learn.cbs
    Runner(cbs=extra).fit(1, warm)  # kernels chosen (compiled), memory pools warm
    if dev.type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    timer = Timer()
    Runner(cbs=[*extra, timer]).fit(1, learn)
    step = timer.train_time / STEPS
    peak = (
        (torch.cuda.max_memory_allocated() - base) / 2**30 if dev.type == 'cuda' else float('nan')
    )
    return dict(
        step_ms=step * 1e3,
        samples_s=BS / step,
        peak_gib=peak,
        loss=timer.loss_value,
        dtypes={p.dtype for p in model.parameters()},
    )


def ours(convert, **kwargs):
    """Setup for one of our converters: it adds its callback to the learner, no extra runner
    callbacks."""

    def setup(learn):
        convert(learn, **kwargs)
        return []

    return setup


contenders = {  # name: (setup, tf32, compiled)
    'fp32': (lambda learn: [], False, False),
    'tf32': (lambda learn: [], True, False),
    'ours_fp16': (ours(to_fp16), False, False),
    'ours_fp16_flat': (ours(to_fp16, flat_master=True), False, False),
    'ours_bf16': (ours(to_bf16), False, False),
    'ours_fp16_compiled': (ours(to_fp16), False, True),
    'amp_fp16': (lambda learn: [TorchAmp(torch.float16)], False, False),
    'amp_bf16': (lambda learn: [TorchAmp(torch.bfloat16)], False, False),
}


def main():
    global WIDTH, DEPTH, BS, STEPS, WARMUP, dev
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument(
        '--dry-run',
        action='store_true',
        help='a tiny run of every contender on the CPU, to check the script',
    )
    ap.add_argument(
        '--peak-tflops',
        type=float,
        default=H200_FP16_DENSE_TFLOPS,
        help="the GPU's dense fp16 tensor-core peak (default: the H200's, 989)",
    )
    ap.add_argument('--only', nargs='*', choices=list(contenders), help='run only these contenders')
    args = ap.parse_args()
    if args.dry_run:
        WIDTH, DEPTH, BS, STEPS, WARMUP, dev = 32, 2, 16, 3, 2, torch.device('cpu')
    elif not torch.cuda.is_available():
        sys.exit('bench/fp16_gpu.py needs a CUDA device (--dry-run checks the script on the CPU)')
    flops = matmul_flops_per_step(layer_sizes(), BS)
    report(
        'device',
        torch.cuda.get_device_name()
        if dev.type == 'cuda'
        else 'cpu (dry run: the figures mean nothing)',
    )
    report('torch', torch.__version__)
    report(
        'model',
        f'MLP 784-{WIDTH}x{DEPTH}-10 with BatchNorm, bs {BS}, SGD momentum 0.9, '
        f'{STEPS} timed steps',
    )
    report('matmul_tflop_per_step', f'{flops / 1e12:.4g}')
    report('peak_tflops', f'{args.peak_tflops:g} (dense fp16; TF32 and fp32 have lower peaks)')
    results = {}
    for name, (setup, tf32, compiled) in contenders.items():
        if args.only and name not in args.only:
            continue
        try:
            results[name] = r = contender(setup, tf32, compiled)
        # torch.compile without its backend (Triton, a C++ compiler): the others still run
        except Exception as e:
            if not compiled:
                raise
            report(
                name,
                f"not available ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]})",
            )
            continue
        tflops = flops / (r['step_ms'] / 1e3) / 1e12
        report(f'{name}_samples_per_s', f"{r['samples_s']:.0f}")
        report(f'{name}_step_ms', f"{r['step_ms']:.2f}")
        report(f'{name}_tflops', f'{tflops:.1f}')
        report(f'{name}_of_fp16_peak', f'{tflops / args.peak_tflops:.1%}')
        report(f'{name}_peak_mem_gib', f"{r['peak_gib']:.2f}")
        report(f'{name}_final_loss', f"{r['loss']:.4f}")
        assert r['dtypes'] == {torch.float32}, f'{name}: the model is not fp32 after fit'

    def ratio(label, a, b):
        if a in results and b in results:
            report(label, f"{results[a]['step_ms'] / results[b]['step_ms']:.3f}")

    for ours_name, amp in (
        ('ours_fp16', 'amp_fp16'),
        ('ours_fp16_flat', 'amp_fp16'),
        ('ours_bf16', 'amp_bf16'),
    ):
        if ours_name in results and 'fp32' in results:
            report(
                f'{ours_name}_speedup_vs_fp32',
                f"{results['fp32']['step_ms'] / results[ours_name]['step_ms']:.2f}",
            )
        ratio(f'{ours_name}_step_vs_{amp}', ours_name, amp)
    ratio('ours_fp16_compiled_step_vs_ours_fp16', 'ours_fp16_compiled', 'ours_fp16')
    if 'tf32' in results and 'fp32' in results:
        report(
            'tf32_speedup_vs_fp32', f"{results['fp32']['step_ms'] / results['tf32']['step_ms']:.2f}"
        )


if __name__ == '__main__':
    main()

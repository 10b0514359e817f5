"""Mixed precision on a GPU: the same MLP trained by the same Runner in fp32 (TF32 off), TF32, our
MixedPrecision (fp16, and bf16) and torch.amp (autocast + GradScaler for fp16; autocast for bf16).
Prints samples/s, the ratios, peak memory and the final loss of each. Goals: ours at least 2x fp32,
and within 1.15x of torch.amp's step time. Needs CUDA; takes about a minute on one H200."""
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from exp.callbacks import Callback, DataBunch, Learner, Runner
from exp.fp16 import to_bf16, to_fp16
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD

if not torch.cuda.is_available(): sys.exit('bench/fp16_gpu.py needs a CUDA device')

WIDTH, DEPTH, BS, STEPS, WARMUP = 8192, 3, 4096, 30, 5
dev = torch.device('cuda')


def report(name, value): print(f'{name}: {value}', flush=True)


def make_data(steps):
    g = torch.Generator(device=dev).manual_seed(0)
    n = BS * steps
    x = torch.randn(n, 784, device=dev, generator=g)
    teacher = torch.randn(784, 10, device=dev, generator=g)
    y = (x @ teacher).argmax(1)  # labels a model can learn, so the final losses say something
    train_ds, valid_ds = Dataset(x, y), Dataset(x[:BS], y[:BS])
    return DataBunch(DataLoader(train_ds, Sampler(train_ds, BS, shuffle=True, seed=0)),
                     DataLoader(valid_ds, Sampler(valid_ds, BS)), c=10)


def make_model():
    torch.manual_seed(0)
    layers, n_in = [], 784
    for _ in range(DEPTH):
        layers += [nn.Linear(n_in, WIDTH), nn.BatchNorm1d(WIDTH), nn.ReLU()]
        n_in = WIDTH
    return nn.Sequential(*layers, nn.Linear(n_in, 10)).to(dev)


class _ScaledOptimizer:
    "An optimizer whose step goes through a GradScaler, as torch.amp's recipe has it."
    def __init__(self, opt, scaler): self.opt, self.scaler, self.param_groups = opt, scaler, opt.param_groups
    def step(self):
        self.scaler.step(self.opt)
        self.scaler.update()
    def zero_grad(self): self.opt.zero_grad()


class TorchAmp(Callback):
    "torch.amp as a Runner callback: autocast around forward and loss; GradScaler for fp16."
    _order = 99

    def __init__(self, dtype): self.dtype = dtype

    def begin_fit(self):
        self.scaler = torch.amp.GradScaler('cuda', enabled=self.dtype == torch.float16)
        self.plain_opt = self.learn.opt
        self.learn.opt = _ScaledOptimizer(self.plain_opt, self.scaler)

    def begin_batch(self):
        self.autocast = torch.autocast('cuda', dtype=self.dtype)
        self.autocast.__enter__()

    def after_loss(self):
        self.autocast.__exit__(None, None, None)
        if self.in_train:
            self.unscaled_loss = self.loss
            self.run.loss = self.scaler.scale(self.loss)

    def after_backward(self): self.run.loss = self.unscaled_loss

    def after_fit(self): self.learn.opt = self.plain_opt


class Timer(Callback):
    "Wall time of the training batches (synchronised), and the last training loss."
    _order = 200

    def begin_fit(self): self.train_time, self.loss_value = 0., float('nan')

    def begin_epoch(self):
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def begin_validate(self):
        torch.cuda.synchronize()
        self.train_time += time.perf_counter() - self.t0
        self.loss_value = self.loss.float().item()


def contender(setup, tf32=False):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    learn = Learner(make_data(STEPS), make_model(), F.cross_entropy, lr=0.01,
                    opt_func=lambda ps, lr: SGD(ps, lr=lr, momentum=0.9))
    extra = setup(learn)
    warm = Learner(make_data(WARMUP), learn.model, F.cross_entropy)
    warm.opt, warm.cbs = learn.opt, learn.cbs
    Runner(cbs=extra).fit(1, warm)  # kernels chosen, memory pools warm
    torch.cuda.reset_peak_memory_stats()
    timer = Timer()
    Runner(cbs=[*extra, timer]).fit(1, learn)
    step = timer.train_time / STEPS
    return dict(step_ms=step * 1e3, samples_s=BS / step, peak_gib=torch.cuda.max_memory_allocated() / 2**30,
                loss=timer.loss_value, dtypes={p.dtype for p in learn.model.parameters()})


def ours(convert, **kwargs):
    "Setup for one of our converters: it adds its callback to the learner, no extra runner callbacks."
    def setup(learn):
        convert(learn, **kwargs)
        return []
    return setup


contenders = {
    'fp32': (lambda learn: [], False),
    'tf32': (lambda learn: [], True),
    'ours_fp16': (ours(to_fp16), False),
    'ours_fp16_flat': (ours(to_fp16, flat_master=True), False),
    'ours_bf16': (ours(to_bf16), False),
    'amp_fp16': (lambda learn: [TorchAmp(torch.float16)], False),
    'amp_bf16': (lambda learn: [TorchAmp(torch.bfloat16)], False),
}
report('device', torch.cuda.get_device_name())
report('torch', torch.__version__)
report('model', f'MLP 784-{WIDTH}x{DEPTH}-10 with BatchNorm, bs {BS}, SGD momentum 0.9, {STEPS} timed steps')
results = {}
for name, (setup, tf32) in contenders.items():
    results[name] = r = contender(setup, tf32)
    report(f'{name}_samples_per_s', f"{r['samples_s']:.0f}")
    report(f'{name}_step_ms', f"{r['step_ms']:.2f}")
    report(f'{name}_peak_mem_gib', f"{r['peak_gib']:.2f}")
    report(f'{name}_final_loss', f"{r['loss']:.4f}")
    assert r['dtypes'] == {torch.float32}, f'{name}: the model is not fp32 after fit'
for ours, amp in (('ours_fp16', 'amp_fp16'), ('ours_fp16_flat', 'amp_fp16'), ('ours_bf16', 'amp_bf16')):
    report(f'{ours}_speedup_vs_fp32', f"{results['fp32']['step_ms'] / results[ours]['step_ms']:.2f}")
    report(f'{ours}_step_vs_{amp}', f"{results[ours]['step_ms'] / results[amp]['step_ms']:.3f}")
report('tf32_speedup_vs_fp32', f"{results['fp32']['step_ms'] / results['tf32']['step_ms']:.2f}")

"""Our BatchNorm2d (exp.batchnorm) against torch's nn.BatchNorm2d: one training step of the layer,
forward plus backward, float32, at the shapes batch norm sees in the series' CNNs. Target: ours
within 2x of torch's at each. Ours trains with its C++ kernel (exp.kernels, appendix notebook
A4_speed; the `kernel` line says whether it was built here); the `_python_` lines time the same
layer with the kernel switched off, the Python passes, which is what a machine without a C++
compiler runs.

The shapes: simple_cnn((1, 16, 16, 2), bn=True) at bs 64 (the 3-vs-7 sample of notebooks 08-10), and
the trainer's simple_cnn((1, 16, 32, 64, 10), bn=True) at bs 32 (`python -m exp.train --arch
simple_cnn`). Then the whole of the first model, one training step with each batch norm. Ours and
torch's are timed in alternating blocks of calls, so that a slow spell of the machine hits both
alike; each line is the median over the rounds.

Everything runs twice: with one torch thread, then with torch's default count (lines prefixed t1_
and tN_, N the count). Each block is timed by the wall clock (`_ratio`) and by the process's CPU
time (`_cpu_ratio`). The Python passes run about two dozen kernels per step (a dozen over the whole
tensor, as many per channel) where torch's layer and our kernel run one loop per pass. On a machine
shared with other work, the wall clock also counts the time the process waited for a core, and with
several threads each kernel is a parallel region whose threads all wait for the last one at its end,
so the Python passes wait more often than torch's: there the one-thread CPU-time ratio is the one
that measures the code.

The `step_parts` lines show where one training step of each layer goes, timed inside the step (the
median over PART_STEPS steps of each part). Our kernel: the forward and backward calls, and the
kernel's two operators inside them. Our Python passes: the forward call, split into the module's
Python with autograd's `Function.apply` around it, and `_BatchNormFunction.forward` itself; the
backward call, split into `_BatchNormFunction.backward` and autograd's own work around it (the
engine, the Python node, accumulating the three gradients); and the per-channel reductions inside
the two passes (`Tensor.sum`), added up per step. Torch's: the forward call, split into its module's
Python and `torch.batch_norm` (its fused kernel, dispatch included), and the backward call. Each
timed part carries the small cost of its timer, and the parts do not add up exactly (each is a
median).
"""

import contextlib
import statistics
import time
from collections import defaultdict

import torch
from torch import nn

import exp.kernels

from common import report
from exp.batchnorm import BatchNorm2d, build_kernel
from exp.norms import _BatchNormFunction  # the layers' autograd Function, timed part by part
from exp.cnn import simple_cnn

ROUNDS = 41
CALLS = 10  # layer steps per timed block
PART_STEPS = 1000  # steps timed part by part
SHAPES = {
    'simple_cnn_bs64': [(64, 16, 14, 14), (64, 16, 7, 7)],
    'train_simple_cnn_bs32': [(32, 16, 14, 14), (32, 32, 7, 7), (32, 64, 4, 4)],
}


def blocks(step, calls):
    "`step` run `calls` times: one timed block."

    def run():
        for _ in range(calls):
            step()

    return run


def layer_inputs(shape):
    "The layer's input (needing a gradient) and the gradient of its output, the same at every call."
    g = torch.Generator().manual_seed(0)
    # batch norm follows a ReLU in these models
    x = torch.randn(shape, generator=g).relu().requires_grad_()
    return x, torch.randn(shape, generator=g)


def layer_step(bn, x, grad):
    """One training step of the layer alone: forward in training mode, backward into the input and
    the parameters."""

    def step():
        x.grad = bn.weight.grad = bn.bias.grad = None
        bn(x).backward(grad)

    return step


def model_step(model, xb, yb):
    "One forward and backward pass of the whole model."

    def step():
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()

    return step


def python_passes(module):
    """`module` with the kernel of each of our BatchNorm2d in it switched off: they train with the
    Python passes."""
    for m in module.modules():
        if isinstance(m, BatchNorm2d):
            m.kernel = False
    return module


def time_steps(steps, calls):
    """Median (wall, CPU) seconds per call of each step function, timed in blocks whose order
    reverses every round."""
    fns = [blocks(step, calls) for step in steps]
    for fn in fns:
        fn()
        fn()  # warm-up
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(ROUNDS):
        for i in order if r % 2 == 0 else order[::-1]:
            w, c = time.perf_counter(), time.process_time()
            fns[i]()
            wall[i].append(time.perf_counter() - w)
            cpu[i].append(time.process_time() - c)
    return [[statistics.median(ts) / calls for ts in clock] for clock in (wall, cpu)]


def report_steps(name, times, unit, scale):
    """The wall-clock times and ratios to torch's, and the CPU-time ratios, of `time_steps`' result
    for ours, torch's, the Python passes."""
    (w_ours, w_theirs, w_python), (c_ours, c_theirs, c_python) = times
    report(f'{name}_ours_{unit}', w_ours * scale, '.1f')
    report(f'{name}_torch_{unit}', w_theirs * scale, '.1f')
    report(f'{name}_python_{unit}', w_python * scale, '.1f')
    report(f'{name}_ratio', w_ours / w_theirs, '.2f')
    report(f'{name}_cpu_ratio', c_ours / c_theirs, '.2f')
    report(f'{name}_python_ratio', w_python / w_theirs, '.2f')
    report(f'{name}_python_cpu_ratio', c_python / c_theirs, '.2f')
    return w_ours / w_theirs, c_ours / c_theirs


def layers(prefix):
    worst = worst_cpu = 0.0
    for model_name, shapes in SHAPES.items():
        for shape in shapes:
            x, grad = layer_inputs(shape)
            bns = (
                BatchNorm2d(shape[1]),
                nn.BatchNorm2d(shape[1]),
                python_passes(BatchNorm2d(shape[1])),
            )
            steps = [layer_step(bn, x, grad) for bn in bns]
            grads = []
            for step, bn in zip(steps, bns):
                step()
                grads.append((x.grad.clone(), bn.weight.grad.clone(), bn.running_var.clone()))
            for mine in (grads[0], grads[2]):  # timing something wrong is pointless
                for a, b in zip(mine, grads[1]):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            ratio, cpu_ratio = report_steps(
                f"{prefix}{model_name}_{'x'.join(map(str, shape))}",
                time_steps(steps, CALLS),
                'us',
                1e6,
            )
            worst, worst_cpu = max(worst, ratio), max(worst_cpu, cpu_ratio)
    report(f'{prefix}worst_layer_ratio', worst, '.2f')
    report(f'{prefix}worst_layer_cpu_ratio', worst_cpu, '.2f')


def whole_model(prefix):
    torch.manual_seed(0)
    ours = simple_cnn((1, 16, 16, 2), bn=True)
    theirs, python = (
        simple_cnn((1, 16, 16, 2), bn=True),
        python_passes(simple_cnn((1, 16, 16, 2), bn=True)),
    )
    for block in theirs:  # the same net with torch's batch norm in place of ours
        if not isinstance(block, nn.Sequential):
            continue
        for i, m in enumerate(block):
            if isinstance(m, BatchNorm2d):
                block[i] = nn.BatchNorm2d(m.num_features)
    theirs.load_state_dict(ours.state_dict())
    python.load_state_dict(ours.state_dict())
    assert sum(type(m) is nn.BatchNorm2d for m in theirs.modules()) == 2
    g = torch.Generator().manual_seed(1)
    xb, yb = torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 2, (64,), generator=g)
    steps = [model_step(model, xb, yb) for model in (ours, theirs, python)]
    report_steps(f'{prefix}simple_cnn_bs64_step', time_steps(steps, 3), 'ms', 1e3)


@contextlib.contextmanager
def timed(owner, name, spans):
    """Within the block, `owner.name` (a function) appends the seconds of each call it makes to
    `spans[name]`."""
    # else inherited (torch.Tensor's methods are its C base class's): deleting ours restores it
    own = name in vars(owner)
    fn = vars(owner)[name] if own else getattr(owner, name)
    inner = fn.__func__ if isinstance(fn, staticmethod) else fn

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spans[name].append(time.perf_counter() - start)

    setattr(owner, name, staticmethod(wrapper) if isinstance(fn, staticmethod) else wrapper)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, fn)
        else:
            delattr(owner, name)


def step_parts(prefix):
    """Where one training step of each layer goes, timed inside the step (medians over PART_STEPS
    steps, in us)."""
    for shape in (shape for shapes in SHAPES.values() for shape in shapes):
        x, grad = layer_inputs(shape)
        parts = {}
        layers = [
            ('python', python_passes(BatchNorm2d(shape[1]))),
            ('torch', nn.BatchNorm2d(shape[1])),
        ]
        # else ours is the Python passes
        if kernel_ops is not None:
            layers.insert(0, ('ours', BatchNorm2d(shape[1])))
        for who, bn in layers:
            spans = defaultdict(list)
            step = layer_step(bn, x, grad)
            for _ in range(50):
                step()  # warm-up, untimed
            with contextlib.ExitStack() as stack:
                # ours: the Function's two passes and the reductions in them; torch's: its fused
                # forward kernel
                wrapped = [
                    (_BatchNormFunction, 'forward'),
                    (_BatchNormFunction, 'backward'),
                    (torch.Tensor, 'sum'),
                    (torch, 'batch_norm'),
                ]
                if kernel_ops is not None:
                    wrapped += [(kernel_ops, 'bn_forward'), (kernel_ops, 'bn_backward')]
                for owner, name in wrapped:
                    stack.enter_context(timed(owner, name, spans))
                for _ in range(PART_STEPS):
                    x.grad = bn.weight.grad = bn.bias.grad = None
                    start = time.perf_counter()
                    y = bn(x)
                    mid = time.perf_counter()
                    y.backward(grad)
                    end = time.perf_counter()
                    # the step's output and what its graph saved are freed here, outside the timed
                    # spans
                    del y
                    spans['forward_call'].append(mid - start)
                    spans['backward_call'].append(end - mid)
            med = {name: statistics.median(ts) * 1e6 for name, ts in spans.items()}
            if who == 'ours':
                parts[who] = (
                    f"forward {med['forward_call']:.1f} (the bn_forward operator "
                    f"{med['bn_forward']:.1f}), "
                    f"backward {med['backward_call']:.1f} (the bn_backward operator "
                    f"{med['bn_backward']:.1f})"
                )
            elif who == 'python':
                n_sums, rest = divmod(len(spans['sum']), PART_STEPS)
                assert n_sums and not rest, f"{len(spans['sum'])} reductions in {PART_STEPS} steps"
                # a step's, added
                reductions = statistics.median(map(sum, zip(*[iter(spans['sum'])] * n_sums))) * 1e6
                parts[who] = (
                    f"forward {med['forward_call']:.1f} (module and apply "
                    f"{med['forward_call'] - med['forward']:.1f}, "
                    f"Function.forward {med['forward']:.1f}), backward {med['backward_call']:.1f} "
                    "(Function.backward "
                    f"{med['backward']:.1f}, autograd around it "
                    f"{med['backward_call'] - med['backward']:.1f}); "
                    f"the {n_sums} reductions {reductions:.1f}"
                )
            else:
                parts[who] = (
                    f"forward {med['forward_call']:.1f} (module "
                    f"{med['forward_call'] - med['batch_norm']:.1f}, "
                    f"torch.batch_norm {med['batch_norm']:.1f}), backward "
                    f"{med['backward_call']:.1f}"
                )
        for who, text in parts.items():
            report(f"{prefix}step_parts_{'x'.join(map(str, shape))}_{who}_us", text)


class KernelOps:
    """The kernel's two operators as attributes that `timed` can wrap (torch's operator namespace
    takes no new attributes)."""

    def __init__(self, ops):
        self.bn_forward, self.bn_backward = ops.bn_forward, ops.bn_backward


report('target_ratio', 2.0)
ops = build_kernel()
report('kernel', 'built and loaded' if ops is not None else 'not built: ours is the Python passes')
# the layers call the kernel through this wrapper too, so that step_parts can time its operators
kernel_ops = exp.kernels._kernel_ops = KernelOps(ops) if ops is not None else None
default_threads = torch.get_num_threads()
for threads in sorted({1, default_threads}):
    torch.set_num_threads(threads)
    report('torch_threads', threads)
    layers(f't{threads}_')
    whole_model(f't{threads}_')
    step_parts(f't{threads}_')

"""Our BatchNorm2d (exp.batchnorm) against torch's nn.BatchNorm2d: one training step of the layer, forward plus
backward, float32, at the shapes batch norm sees in the series' CNNs. Target: ours within 2x of torch's at each.

The shapes: simple_cnn((1, 16, 16, 2), bn=True) at bs 64 (the 3-vs-7 sample of notebooks 08-10), and the
trainer's simple_cnn((1, 16, 32, 64, 10), bn=True) at bs 32 (`python -m exp.train --arch simple_cnn`). Then the
whole of the first model, one training step with each batch norm. Ours and torch's are timed in alternating
blocks of calls, so that a slow spell of the machine hits both alike; each line is the median over the rounds.
"""
import torch
from torch import nn

from common import median_times, report
from exp.batchnorm import BatchNorm2d
from exp.cnn import simple_cnn

ROUNDS = 21
CALLS = 20  # layer steps per timed block
SHAPES = {'simple_cnn_bs64': [(64, 16, 14, 14), (64, 16, 7, 7)],
          'train_simple_cnn_bs32': [(32, 16, 14, 14), (32, 32, 7, 7), (32, 64, 4, 4)]}


def layer_step(bn, x, grad):
    "One training step of the layer alone: forward in training mode, backward into the input and the parameters."
    def step():
        x.grad = bn.weight.grad = bn.bias.grad = None
        bn(x).backward(grad)
    return step


def blocks(fn, calls):
    def run():
        for _ in range(calls): fn()
    return run


report('torch_threads', torch.get_num_threads())
report('target_ratio', 2.0)
ratios = []
for model_name, shapes in SHAPES.items():
    for shape in shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=g).relu().requires_grad_()  # batch norm follows a ReLU in these models
        grad = torch.randn(shape, generator=g)
        ours, theirs = BatchNorm2d(shape[1]), nn.BatchNorm2d(shape[1])
        steps = [layer_step(ours, x, grad), layer_step(theirs, x, grad)]
        grads = []
        for step, bn in zip(steps, (ours, theirs)):
            step()
            grads.append((x.grad.clone(), bn.weight.grad.clone()))
        for a, b in zip(*grads): torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # timing something wrong is pointless
        t_ours, t_torch = median_times(blocks(steps[0], CALLS), blocks(steps[1], CALLS), repeats=ROUNDS, warmup=2)
        name = f"{model_name}_{'x'.join(map(str, shape))}"
        report(f'{name}_ours_us', t_ours / CALLS * 1e6, '.1f')
        report(f'{name}_torch_us', t_torch / CALLS * 1e6, '.1f')
        report(f'{name}_ratio', t_ours / t_torch, '.2f')
        ratios.append(t_ours / t_torch)
report('worst_layer_ratio', max(ratios), '.2f')


def model_step(model, xb, yb):
    def step():
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()
    return step


torch.manual_seed(0)
ours_model = simple_cnn((1, 16, 16, 2), bn=True)
theirs_model = simple_cnn((1, 16, 16, 2), bn=True)
for block in theirs_model:  # the same net with torch's batch norm in place of ours
    for i, m in enumerate(block if isinstance(block, nn.Sequential) else []):
        if isinstance(m, BatchNorm2d): block[i] = nn.BatchNorm2d(m.num_features)
theirs_model.load_state_dict(ours_model.state_dict())
assert sum(type(m) is nn.BatchNorm2d for m in theirs_model.modules()) == 2
g = torch.Generator().manual_seed(1)
xb, yb = torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 2, (64,), generator=g)
t_ours, t_torch = median_times(blocks(model_step(ours_model, xb, yb), 5), blocks(model_step(theirs_model, xb, yb), 5),
                               repeats=ROUNDS, warmup=2)
report('simple_cnn_bs64_step_ours_ms', t_ours / 5 * 1e3, '.2f')
report('simple_cnn_bs64_step_torch_bn_ms', t_torch / 5 * 1e3, '.2f')
report('simple_cnn_bs64_step_ratio', t_ours / t_torch, '.2f')

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


@pytest.mark.parametrize('sizes, bs', [([784, 32, 32, 10], 16), ([5, 7, 3], 4), ([784, 64, 64, 64, 10], 9)])
def test_matmul_flops_per_step_is_what_torch_counts(sizes, bs, monkeypatch):
    "Our count of one training step's matrix-product FLOPs equals torch's FlopCounterMode over forward and backward."
    monkeypatch.setattr(fp16_gpu, 'layer_sizes', lambda: sizes)
    monkeypatch.setattr(fp16_gpu, 'dev', torch.device('cpu'))
    model = fp16_gpu.make_model()
    x, y = torch.randn(bs, sizes[0]), torch.randint(0, sizes[-1], (bs,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    assert fp16_gpu.matmul_flops_per_step(sizes, bs) == counter.get_total_flops()


def test_the_h200_figure():
    "The MLP of fp16_gpu.py at 8.66 ms a step (ours, fp16, on the H200) ran at about 40% of the dense fp16 peak."
    flops = fp16_gpu.matmul_flops_per_step([784, 8192, 8192, 8192, 10], 4096)
    assert abs(flops / 8.66e-3 / 1e12 / fp16_gpu.H200_FP16_DENSE_TFLOPS - 0.40) < 0.01


@pytest.mark.slow
def test_fp16_gpu_dry_run_on_cpu():
    "The GPU benchmark runs end to end on the CPU (a tiny model), the compiled contender included."
    proc = subprocess.run([sys.executable, 'bench/fp16_gpu.py', '--dry-run', '--only', 'fp32', 'ours_fp16', 'ours_fp16_compiled',
                           'amp_fp16'], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(': ', 1) for line in proc.stdout.splitlines() if ': ' in line)
    for name in ('fp32', 'ours_fp16', 'ours_fp16_compiled', 'amp_fp16'):
        assert float(lines[f'{name}_step_ms']) > 0 and lines[f'{name}_of_fp16_peak'].endswith('%')
        assert 2.0 < float(lines[f'{name}_final_loss']) < 2.7  # ten classes, three steps: near log(10) = 2.30
    assert 'ours_fp16_compiled_step_vs_ours_fp16' in lines

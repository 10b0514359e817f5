"""Unit tests for exp.kernels (appendix notebook A4_speed) on their own: the batch-norm kernel's
autograd Function with any holder of running statistics, the module standing apart from the lessons
that use it, and the names the lessons' modules still export. The layers with the kernel:
test_batchnorm.py; try_compile with log_softmax: test_loss.py."""

import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test

import exp.batchnorm
import exp.kernels
import exp.loss
from exp.kernels import build_kernel, kernel_batch_norm, kernel_fits, try_compile

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get('CXX', 'c++')) is None,
    reason='no C++ compiler here to build the kernel with',
)


def holder(c, momentum):
    "A batch norm's running statistics, without the batch norm."
    return SimpleNamespace(
        running_mean=torch.zeros(c),
        running_var=torch.ones(c),
        num_batches_tracked=torch.tensor(0),
        momentum=momentum,
    )


@needs_compiler
@pytest.mark.parametrize('momentum', [0.1, None])
@pytest.mark.parametrize('shape', [(16, 6, 5, 5), (32, 6), (8, 6, 7)])
def test_the_kernel_function_takes_any_holder_of_running_statistics(shape, momentum):
    assert build_kernel() is not None
    c = shape[1]
    ours, ref = holder(c, momentum), holder(c, momentum)
    g = torch.Generator().manual_seed(0)
    weight = torch.linspace(0.5, 1.5, c).requires_grad_()
    bias = torch.linspace(-0.3, 0.3, c).requires_grad_()
    for step in range(3):
        x = torch.randn(shape, generator=g) * 3 + 1
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = kernel_batch_norm(xa, weight, bias, 1e-5, ours)
        # torch's module passes momentum 0.0 and the weight 1/count itself where momentum is None
        m = momentum if momentum is not None else 1 / (step + 1)
        yb = F.batch_norm(xb, ref.running_mean, ref.running_var, weight, bias, True, m, eps=1e-5)
        torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
        grad = torch.randn(shape, generator=g)
        got = torch.autograd.grad(ya, (xa, weight, bias), grad)
        want = torch.autograd.grad(yb, (xb, weight, bias), grad)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-5, atol=1e-5)
        ft.test_eq(ours.num_batches_tracked, torch.tensor(step + 1))


@needs_compiler
def test_the_kernel_function_without_a_holder_moves_nothing():
    assert build_kernel() is not None
    x = torch.randn(8, 4, 3, 3)
    y = kernel_batch_norm(x, None, None, 1e-5, None)
    torch.testing.assert_close(y, F.batch_norm(x, None, None, training=True), rtol=1e-5, atol=1e-5)


def test_the_kernels_module_imports_no_lesson_module():
    "exp.kernels stands alone: the lessons import it, so it must not import them (no cycle)."
    code = 'import sys, exp.kernels; print(sorted(m for m in sys.modules if m.startswith("exp.")))'
    out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    ft.test_eq(out.strip(), "['exp.kernels']")


def test_the_lessons_modules_still_export_the_moved_names():
    assert exp.batchnorm.build_kernel is build_kernel
    assert exp.loss.try_compile is try_compile
    assert 'build_kernel' in exp.batchnorm.__all__ and 'try_compile' in exp.loss.__all__
    # the layers call the kernel through exp.kernels' public names
    assert exp.batchnorm.kernel_fits is kernel_fits
    assert exp.batchnorm.kernel_batch_norm is kernel_batch_norm


def test_try_compile_takes_any_function(monkeypatch):
    "try_compile needs nothing of exp.loss: any function, compiled or handed back with the reason."

    def refuse(fn, **kwargs):
        raise RuntimeError('no compiler here\nmore detail')

    monkeypatch.setattr(torch, 'compile', refuse)
    fn, why_not = try_compile(torch.relu, torch.randn(3))
    assert fn is torch.relu
    ft.test_eq(why_not, 'RuntimeError: no compiler here')

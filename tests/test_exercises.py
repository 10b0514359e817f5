"""The notebooks' exercise checks: each passes a reference solution, rejects wrong ones with a
helpful message, and reports an exercise not yet answered without failing. The reference solutions
live here, out of the learner's way."""

import copy
import math

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import exp.backprop
from exp.exercises import check_cos_anneal, check_one_cycle_lr
from exp.exercises import check_cancelled_batch, check_n_events
from exp.exercises import check_logsumexp_rows, check_nll_by_hand
from exp.exercises import check_leaky_relu_function, check_scale_backward, check_sigmoid_backward
from exp.exercises import check_idx_dims, check_normalize_valid
from exp.exercises import check_next_scale, check_smallest_scale
from exp.exercises import check_resume_start, check_suggest_lr
from exp.exercises import (
    ExerciseError,
    check_mse,
    check_one_hot,
    check_relu,
    exercise,
    expect_close,
    expect_number,
)
from exp.exercises import check_fold_bn, check_instance_norm, check_running_var_after
from exp.exercises import check_conv_out_size, check_conv_params
from exp.exercises import check_averaged_grad, check_rank_share
from exp.exercises import check_lr_at, check_stopping_epoch
from exp.exercises import check_fan_in, check_he_std, check_zero_fraction
from exp.exercises import check_mixup_batch, check_smooth_targets, check_tta_probs
from exp.exercises import check_eta, check_redrawn_line
from exp.exercises import check_epoch_loss, check_n_batches
from exp.exercises import check_adam_first_step, check_ewma_after_three, check_rmsprop_step
from exp.exercises import check_cycle_lrs, check_partial_folder


def not_answered(*args, **kwargs):
    raise NotImplementedError  # what the notebooks' exercise cells hold until they are filled in


# ---------------- reference solutions


def cycle_lrs(max_lr):
    return max_lr / 10, max_lr / 1e5


def rank_share(batch, rank, world_size):
    return batch[rank::world_size]


def averaged_grad(grads, sizes):
    return sum(g * n for g, n in zip(grads, sizes)) / sum(sizes)


def partial_name(out):
    return Path(out).with_name(Path(out).name + '.partial')


def resume_start(saved_epoch, epochs):
    return min(saved_epoch + 1, epochs)


def suggest(lrs, losses, beta=0.9):
    avg, best, best_lr = 0.0, math.inf, lrs[0]
    for i, (lr, loss) in enumerate(zip(lrs, losses), 1):
        if not math.isfinite(loss):
            break
        avg = beta * avg + (1 - beta) * loss
        if avg / (1 - beta**i) < best:
            best, best_lr = avg / (1 - beta**i), lr
    return best_lr / 10


def suggest_biased(lrs, losses, beta=0.9):  # the average without its bias correction
    avg, best, best_lr = 0.0, math.inf, lrs[0]
    for lr, loss in zip(lrs, losses):
        if not math.isfinite(loss):
            break
        avg = beta * avg + (1 - beta) * loss
        if avg < best:
            best, best_lr = avg, lr
    return best_lr / 10


def next_scale(scale, overflow, noskip, max_noskip):
    if overflow:
        return scale / 2, 0
    noskip += 1
    return (scale * 2, 0) if noskip >= max_noskip else (scale, noskip)


def next_scale_compared_before_counting(scale, overflow, noskip, max_noskip):
    if overflow:
        return scale / 2, 0
    return (scale * 2, 0) if noskip >= max_noskip else (scale, noskip + 1)


def smallest_scale(g):
    return 2.0 ** max(0, math.ceil(math.log2(2**-14 / g)))


def idx_dims(raw):
    return [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], 'big') for i in range(raw[3])]


def normalize_valid(x_train, x_valid):
    return (x_valid - x_train.mean()) / x_train.std()


def mse(pred, target):
    return ((pred - target) ** 2).mean()


def one_hot(y, c):
    return torch.zeros(len(y), c).scatter_(1, y[:, None], 1.0)


def sigmoid_backward(inp, out_g):
    s = torch.sigmoid(inp)
    return s * (1 - s) * out_g


def scale_backward(inp, w, out_g):
    return out_g * w, (inp * out_g).sum(0)


class LeakyReluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x > 0, x, 0.1 * x)

    @staticmethod
    def backward(ctx, out_g):
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, out_g, 0.1 * out_g)


def rmsprop_step(p, grad, square_avg, lr=0.01, alpha=0.99, eps=1e-8):
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    p.addcdiv_(grad, square_avg.sqrt().add_(eps), value=-lr)


def he_std(fan_in, leak):
    return math.sqrt(2 / ((1 + leak**2) * fan_in))


def zero_fraction(hook, module, inp, out):
    if not hasattr(hook, 'zeros'):
        hook.zeros = []
    if module.training:
        hook.zeros.append((out == 0).float().mean())


# one output's weights: in_channels / groups x kernel area
def fan_in(layer):
    return layer.weight[0].numel()


def instance_norm(x, eps=1e-5):
    mean, var = x.mean((2, 3), keepdim=True), x.var((2, 3), keepdim=True, unbiased=False)
    return (x - mean) / (var + eps).sqrt()


def fold_bn(conv, bn):
    scale = bn.weight / (bn.running_var + bn.eps).sqrt()
    folded = copy.deepcopy(conv)
    with torch.no_grad():
        folded.weight.mul_(scale.view(-1, 1, 1, 1))
        folded.bias.copy_((conv.bias - bn.running_mean) * scale + bn.bias)
    return folded


def running_var_after(running_var, x, momentum):
    return (1 - momentum) * running_var + momentum * x.var((0, 2, 3))


def lr_at(i, min_lr, max_lr, max_iter):
    return min_lr * (max_lr / min_lr) ** (i / (max_iter - 1))


def stopping_epoch(losses, patience):
    best, wait = math.inf, 0
    for epoch, loss in enumerate(losses):
        if loss < best:
            best, wait = loss, 0
        else:
            wait += 1
        if wait == patience:
            return epoch
    return None


# ---------------- wrong ones, and what the checks say about them


def zero_fraction_in_eval_too(hook, module, inp, out):
    if not hasattr(hook, 'zeros'):
        hook.zeros = []
    hook.zeros.append((out == 0).float().mean())


def zero_fraction_of_negatives(hook, module, inp, out):  # looks at the input, not the output
    if not hasattr(hook, 'zeros'):
        hook.zeros = []
    if module.training:
        hook.zeros.append((inp[0] < 0).float().mean())


def fold_bn_without_beta(conv, bn):
    folded = fold_bn(conv, bn)
    with torch.no_grad():
        folded.bias.sub_(bn.bias)
    return folded


def fold_bn_scale_only(conv, bn):
    folded = copy.deepcopy(conv)
    with torch.no_grad():
        folded.weight.mul_((bn.weight / (bn.running_var + bn.eps).sqrt()).view(-1, 1, 1, 1))
    return folded


class LeakyForgetsTheSlope(LeakyReluFunction):
    @staticmethod
    def backward(ctx, out_g):
        (x,) = ctx.saved_tensors
        return (x > 0) * out_g


class LeakyIsRelu(LeakyReluFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp_min(0)


def rmsprop_eps_inside(p, grad, square_avg, lr=0.01, alpha=0.99, eps=1e-8):
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    p.addcdiv_(grad, (square_avg + eps).sqrt(), value=-lr)


def rmsprop_no_average(p, grad, square_avg, lr=0.01, alpha=0.99, eps=1e-8):
    square_avg.copy_(grad * grad)
    p.addcdiv_(grad, square_avg.sqrt().add_(eps), value=-lr)


def rmsprop_new_tensor(p, grad, square_avg, lr=0.01, alpha=0.99, eps=1e-8):
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    return p - lr * grad / (square_avg.sqrt() + eps)


def eta(elapsed, done, total):
    return elapsed / done * (total - done)


def redrawn_line(raw):
    shown = ''
    for part in raw.split('\r'):
        shown = part + shown[len(part) :]
    return shown


def conv_out_size(n, ks, stride, padding):
    return (n + 2 * padding - ks) // stride + 1


def conv_params(ni, nf, ks):
    return nf * ni * ks * ks + nf


def n_batches(n, bs, drop_last):
    return n // bs if drop_last else -(-n // bs)


def epoch_loss(losses, sizes):
    return (losses * sizes).sum() / sizes.sum()


def stopping_epoch_vs_previous(losses, patience):  # counts the epochs worse than the one before
    wait = 0
    for epoch in range(1, len(losses)):
        wait = wait + 1 if losses[epoch] >= losses[epoch - 1] else 0
        if wait == patience:
            return epoch
    return None


def stopping_epoch_on_ties(losses, patience):  # takes an equal loss for a new best
    return stopping_epoch([l - 1e-9 * i for i, l in enumerate(losses)], patience)


def stopping_epoch_from_one(losses, patience):
    epoch = stopping_epoch(losses, patience)
    return None if epoch is None else epoch + 1


def cos_anneal(start, end, pos):
    return start + (1 - math.cos(math.pi * pos)) / 2 * (end - start)


def one_cycle_lr(pos, lr, pct_start=0.3, div_start=10.0, div_end=1e5):
    if pos < pct_start:
        return cos_anneal(lr / div_start, lr, pos / pct_start)
    return cos_anneal(lr, lr / div_end, (pos - pct_start) / (1 - pct_start))


def n_events(n_train, n_valid, epochs):
    return 2 + epochs * (3 + 6 * n_train + 4 * n_valid)


CANCELLED_BATCH = ['begin_batch', 'after_pred', 'after_cancel_batch', 'after_batch']


def logsumexp_rows(x):
    m = x.amax(-1, keepdim=True)
    return (m + (x - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)


def nll_by_hand(log_probs, target):
    return -log_probs[torch.arange(len(target)), target].mean()


# lesson 14's reference solutions
def smooth_targets(y, c, eps):
    return F.one_hot(y, c).float() * (1 - eps) + eps / c


def mixup_batch(x, perm, lam):
    lam = torch.max(lam, 1 - lam).view(-1, 1, 1, 1)
    return lam * x + (1 - lam) * x[perm]


def tta_probs(model, x):
    return (F.softmax(model(x), -1) + F.softmax(model(x.flip(-1)), -1)) / 2


def _raw_mix(x, perm, lam):
    lam = lam.view(-1, 1, 1, 1)
    return lam * x + (1 - lam) * x[perm]


CHECKS = [
    (
        check_logsumexp_rows,
        logsumexp_rows,
        [
            (lambda x: x.exp().sum(-1).log(), 'not finite on rows near 1000'),
            (lambda x: (x - x.amax(-1, keepdim=True)).exp().sum(-1).log(), 'not added back'),
            (
                lambda x: logsumexp_rows(x) + 1e-2,
                r'its element \d+ \(counting in order\) is .* but should be',
            ),
            (lambda x: logsumexp_rows(x)[:, None], 'has shape'),
            (lambda x: logsumexp_rows(x).tolist(), 'should be a tensor'),
        ],
    ),
    (
        check_nll_by_hand,
        nll_by_hand,
        [
            (lambda lp, t: -nll_by_hand(lp, t), 'the sign'),
            (lambda lp, t: nll_by_hand(lp, t) * len(t), 'the sum over the rows'),
            (lambda lp, t: -lp[:, t].mean(), 'picks every label'),
            (
                lambda lp, t: -lp.mean(),
                r'nll_by_hand\(log_probs, target\) is wrong: its element 0 .*; index each row',
            ),
            (lambda lp, t: float(nll_by_hand(lp, t)), 'should be a tensor'),
        ],
    ),
    (
        check_n_events,
        n_events,
        [
            (lambda t, v, e: e * (3 + 6 * t + 4 * v), 'once per fit'),
            (lambda t, v, e: 2 + e * (3 + 6 * (t + v)), 'a validation batch has no backward'),
            (lambda t, v, e: 2 + e * (2 + 6 * t + 4 * v), 'three events of its own'),
            (
                lambda t, v, e: n_events(t, v, e) + (t == 3),
                r'n_events\(3, 2, 2\) = 61, should be 60\. Hint',
            ),
            (lambda t, v, e: float(n_events(t, v, e)), 'should be an int'),
        ],
    ),
    (
        check_cancelled_batch,
        CANCELLED_BATCH,
        [
            (
                ['begin_batch', 'after_pred', 'after_loss', 'after_cancel_batch', 'after_batch'],
                'skips the rest of the batch',
            ),
            (CANCELLED_BATCH[:-1], 'after_batch runs for a cancelled batch too'),
            (['begin_batch', 'after_pred', 'after_batch'], 'after_cancel_batch'),
            (
                ['begin_batch', 'after_pred', 'after_cancel', 'after_batch'],
                "'after_cancel' is not an event",
            ),
            (
                ['begin_batch', 'after_cancel_batch', 'after_pred', 'after_batch'],
                'is not what the Runner fires',
            ),
            ('begin_batch', 'should be a list of event names'),
        ],
    ),
    (
        check_cos_anneal,
        cos_anneal,
        [
            (lambda s, e, p: s + (1 - math.cos(math.pi * p)) * (e - s), 'twice as far'),
            (lambda s, e, p: s + p * (e - s), 'that is the linear schedule'),
            (lambda s, e, p: cos_anneal(e, s, p), 'runs from end to start'),
            (
                lambda s, e, p: s + (1 - math.cos(p)) / 2 * (e - s),
                r'cos_anneal\(1.0, 3.0, 1.0\) = .*, should be 3\. Hint',
            ),
            (lambda s, e, p: str(cos_anneal(s, e, p)), 'should be a number'),
        ],
    ),
    (
        check_one_cycle_lr,
        one_cycle_lr,
        [
            (
                lambda pos, lr, pct=0.3, ds=10.0, de=1e5: (
                    cos_anneal(lr / ds, lr, pos) if pos < pct else cos_anneal(lr, lr / de, pos)
                ),
                "its own pos",
            ),
            (
                lambda pos, lr, pct=0.3, ds=10.0, de=1e5: (
                    lr / ds + (lr - lr / ds) * pos / pct
                    if pos < pct
                    else lr + (lr / de - lr) * (pos - pct) / (1 - pct)
                ),
                'linear in each phase',
            ),
            (
                lambda pos, lr, pct=0.3, ds=10.0, de=1e5: one_cycle_lr(
                    pos, lr, pct, ds, float('inf')
                ),
                'ends at 0',
            ),
            (
                lambda pos, lr, pct=0.3, ds=10.0, de=1e5: one_cycle_lr(pos, lr, 0.3, ds, de),
                r'one_cycle_lr\(0.25, 1.0, 0.5\) = .*, should be .*\. Hint',
            ),
            (
                lambda pos, lr, *args: torch.tensor([one_cycle_lr(pos, lr, *args)] * 2),
                'should be a number',
            ),
        ],
    ),
    (
        check_resume_start,
        resume_start,
        [
            (lambda saved, epochs: saved, 'trains the saved epoch again'),
            (
                lambda saved, epochs: saved + 1,
                r'resume_start\(5, 3\) is 6, after the end of a 3-epoch fit',
            ),
            (
                lambda saved, epochs: min(saved + 2, epochs),
                r'resume_start\(1, 4\) is 3, should be 2\. Hint',
            ),
            (lambda saved, epochs: float(min(saved + 1, epochs)), 'should return ints'),
        ],
    ),
    (
        check_suggest_lr,
        suggest,
        [
            (lambda lrs, losses: suggest(lrs, losses) * 10, 'suggest a tenth of it'),
            (
                lambda lrs, losses: lrs[min(range(len(lrs)), key=lambda i: losses[i])] / 10,
                'smooth the losses first',
            ),
            (suggest_biased, 'without debiasing'),
            (
                lambda lrs, losses: suggest(lrs, losses, beta=0.5),
                r'on the first curve, should be .*\. Hint',
            ),
            (lambda lrs, losses: str(lrs[0]), 'should return numbers'),
        ],
    ),
    (
        check_next_scale,
        next_scale,
        [
            (
                lambda scale, overflow, noskip, m: (
                    (scale * 2, 0) if overflow else next_scale(scale, overflow, noskip, m)
                ),
                'halve it',
            ),
            (
                lambda scale, overflow, noskip, m: (
                    (scale / 2, noskip) if overflow else next_scale(scale, overflow, noskip, m)
                ),
                'noskip goes back to 0',
            ),
            (next_scale_compared_before_counting, "count this batch's good step first"),
            (
                lambda scale, overflow, noskip, m: (
                    (scale, 0) if overflow else next_scale(scale, overflow, noskip, m)
                ),
                r'next_scale\(65536.0, True, 5, 8\) is \(65536.0, 0\), should be \(32768.0, 0\)\. '
                r'Hint',
            ),
            (lambda scale, overflow, noskip, m: scale, r'should return a pair \(scale, noskip\)'),
        ],
    ),
    (
        check_smallest_scale,
        smallest_scale,
        [
            (lambda g: max(0, math.ceil(math.log2(2**-14 / g))), 'that is the exponent k'),
            (
                lambda g: 2.0 ** max(0, math.ceil(math.log2(2**-24 / g))),
                'the target is the smallest normal',
            ),
            (lambda g: 2.0 ** max(0, math.floor(math.log2(2**-14 / g))), 'round the exponent up'),
            (lambda g: 2.0 ** math.ceil(math.log2(2**-14 / g)), 'a scale is never below 1'),
            (lambda g: 2.0**16, r'smallest_scale\(1e-08\) is 65536.0, should be 8192.0\. Hint'),
            (lambda g: str(g), 'should return numbers'),
        ],
    ),
    (
        check_idx_dims,
        idx_dims,
        [
            (
                lambda raw: [
                    int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], 'little') for i in range(raw[3])
                ],
                "big-endian",
            ),
            (
                lambda raw: [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], 'big') for i in range(3)],
                'byte 3 of the header is the number',
            ),
            (
                lambda raw: [
                    int.from_bytes(raw[3 + 4 * i : 7 + 4 * i], 'big') for i in range(raw[3])
                ],
                r'shape \[3, 300, 2\], idx_dims gave .*\. Hint',
            ),
            (lambda raw: raw[4:8], r'gave \[0, 0, 0, 3\]: byte 3'),
            (lambda raw: None, 'should return a list of ints'),
        ],
    ),
    (
        check_normalize_valid,
        normalize_valid,
        [
            (lambda xt, xv: (xv - xv.mean()) / xv.std(), "the validation set's own statistics"),
            (
                lambda xt, xv: (xt - xt.mean()) / xt.std(),
                r'has shape \(200, 12\), but should have shape \(50, 12\)',
            ),
            (lambda xt, xv: xv - xt.mean(), 'divide by the training set.s std too'),
            (lambda xt, xv: (xv - xt.mean()) / xt.var(), 'not the variance'),
            (lambda xt, xv: (xv - 0.5) / 0.3, 'its element .* but should be'),
        ],
    ),
    (
        check_relu,
        lambda x: x.clamp_min(0),
        [
            (lambda x: x.clamp_max(0), 'that keeps the negative elements'),
            (lambda x: x.abs(), 'that is the absolute value'),
            (
                lambda x: x * 2,
                r'relu\(x\) is wrong: its element 0 \(counting in order\) is -4 but should be 0',
            ),
            (lambda x: x.tolist(), 'should be a tensor, got list'),
        ],
    ),
    (
        check_mse,
        mse,
        [
            (lambda p, t: ((p - t) ** 2).sum(), 'that is the sum of the squares'),
            (lambda p, t: (p - t).abs().mean(), 'the mean absolute difference'),
            (lambda p, t: ((p - t) ** 2).mean().sqrt(), r'its square root \(the RMSE\)'),
            (lambda p, t: (p - t).mean() ** 2, 'square each difference first'),
            (lambda p, t: ((p - t) ** 2).mean(0), r'has shape \(3,\), but should have shape \(\)'),
        ],
    ),
    (
        check_one_hot,
        one_hot,
        [
            (lambda y, c: one_hot(y, c).T, r'has shape \(4, 5\): one row per label'),
            (lambda y, c: one_hot(y, c).long(), 'should be a float tensor'),
            (lambda y, c: 1 - one_hot(y, c), r'row i is all zeros except a 1 in column y\[i\]'),
            (lambda y, c: y.float(), r'has shape \(5,\), but should have shape \(5, 4\)'),
        ],
    ),
    (
        check_sigmoid_backward,
        sigmoid_backward,
        [
            (
                lambda inp, g: torch.sigmoid(inp) * (1 - torch.sigmoid(inp)),
                'the chain rule multiplies it by out_g',
            ),
            (
                lambda inp, g: torch.sigmoid(inp) * g,
                r'sigmoid\(x\) \* \(1 - sigmoid\(x\)\), not sigmoid\(x\)',
            ),
            (lambda inp, g: inp * (1 - inp) * g, 'compute s = torch.sigmoid'),
            (lambda inp, g: g[:, :3], r'has shape \(8, 3\), but should have shape \(8, 5\)'),
            (lambda inp, g: -g, 'should be .*; the gradient is out_g times the derivative'),
        ],
    ),
    (
        check_scale_backward,
        scale_backward,
        [
            (lambda inp, w, g: (g * w, inp * g), 'w_g has one row per example'),
            (lambda inp, w, g: (g, (inp * g).sum(0)), 'inp_g is wrong: out = inp \\* w'),
            (lambda inp, w, g: (g * w, (inp * g).mean(0)), 'sum over the batch, not the mean'),
            (lambda inp, w, g: (g * w, g.sum(0)), 'out_g times the input that w multiplied'),
            (lambda inp, w, g: g * w, r'should return a pair \(inp_g, w_g\)'),
        ],
    ),
    (
        check_leaky_relu_function,
        LeakyReluFunction,
        [
            (LeakyForgetsTheSlope, 'below zero the gradient is 0.1 \\* out_g, not 0'),
            (LeakyIsRelu, 'that is ReLU'),
            (lambda x: x, 'should be a subclass of torch.autograd.Function'),
        ],
    ),
    (
        check_ewma_after_three,
        1 - 0.9**3,
        [
            (0.9**3, 'the weight still on the starting 0'),
            (0.3, 'the weights are not equal'),
            (0.5, 'compute it step by step'),
            ('0.271', 'should be a number'),
        ],
    ),
    (
        check_rmsprop_step,
        rmsprop_step,
        [
            (rmsprop_eps_inside, 'eps outside the root'),
            (rmsprop_no_average, 'square_avg starts at 0 and is an EWMA'),
            (rmsprop_new_tensor, 'must update p in place'),
        ],
    ),
    (
        check_adam_first_step,
        -0.01 * 1e-3 / (1e-3 + 1e-8),
        [
            (0.01, 'the change is negative'),
            (-1e-5, "that is SGD's step"),
            (-0.0316, 'without bias correction'),
            (-0.02, 'debias both'),
        ],
    ),
    (
        check_he_std,
        he_std,
        [
            (lambda fan_in, leak: math.sqrt(2 / fan_in), 'the std for a plain ReLU'),
            (lambda fan_in, leak: math.sqrt(1 / fan_in), 'the layer multiplies the variance'),
            (lambda fan_in, leak: 'sqrt(2/n)', 'should be a number'),
        ],
    ),
    (
        check_zero_fraction,
        zero_fraction,
        [
            (zero_fraction_in_eval_too, 'record the training batches only'),
            (zero_fraction_of_negatives, r'should be \[0.5, 1.0\]'),
            (lambda hook, module, inp, out: None, 'a list hook.zeros'),
        ],
    ),
    (
        check_fan_in,
        fan_in,
        [
            (
                lambda layer: (
                    layer.weight.shape[1] * layer.weight[0, 0].numel() * getattr(layer, 'groups', 1)
                ),
                "only its group's",
            ),
            (lambda layer: layer.weight.shape[1], 'times the kernel.s area'),
        ],
    ),
    (
        check_instance_norm,
        instance_norm,
        [
            (
                lambda x, eps=1e-5: (
                    (x - x.mean((2, 3), keepdim=True)) / (x.var((2, 3), keepdim=True) + eps).sqrt()
                ),
                'biased variance',
            ),
            (
                lambda x, eps=1e-5: nn.functional.layer_norm(x, x.shape[1:], eps=eps),
                'that is layer norm',
            ),
            (lambda x, eps=1e-5: x[:, :2], 'should have shape'),
        ],
    ),
    (
        check_fold_bn,
        fold_bn,
        [
            (fold_bn_without_beta, "batch norm's own bias is missing"),
            (fold_bn_scale_only, "the convolution's bias goes through batch norm too"),
            (
                lambda conv, bn: copy.deepcopy(conv).requires_grad_(False),
                'in eval, bn\\(y\\) = y \\* s \\+ t',
            ),
            (lambda conv, bn: nn.Sequential(conv, bn), 'should return an nn.Conv2d'),
        ],
    ),
    (
        check_running_var_after,
        running_var_after,
        [
            (
                lambda rv, x, m: (1 - m) * rv + m * x.var((0, 2, 3), unbiased=False),
                'the unbiased one',
            ),
            (
                lambda rv, x, m: m * rv + (1 - m) * x.var((0, 2, 3)),
                'momentum is the weight of the new value',
            ),
            (lambda rv, x, m: x.var((0, 2, 3)), 'moves only part of the way'),
        ],
    ),
    (
        check_lr_at,
        lr_at,
        [
            (lambda i, lo, hi, n: lo + (hi - lo) * i / (n - 1), 'that grows linearly'),
            (lambda i, lo, hi, n: lo * (hi / lo) ** (i / n), 'one batch too late'),
            (
                lambda i, lo, hi, n: lo * (hi / lo) ** (i / (n + 1)),
                r'lr_at\(99, 1e-06, 10.0, 100\) = .*, should be 10\. Hint',
            ),
            (lambda i, lo, hi, n: str(lo), 'should be a number'),
        ],
    ),
    (
        check_stopping_epoch,
        stopping_epoch,
        [
            (stopping_epoch_vs_previous, 'not with the epoch before'),
            (lambda losses, patience: stopping_epoch(losses, patience + 1), 'one epoch too many'),
            (stopping_epoch_on_ties, 'equal to the best is not an improvement'),
            (stopping_epoch_from_one, 'count the epochs from 0'),
            (
                lambda losses, patience: len(losses) - 1,
                r'stopping_epoch\(\[1.0, 0.9, 0.8, 0.85, 0.83, 0.9\], 2\) is 5, should be 4\. Hint',
            ),
        ],
    ),
    (
        check_eta,
        eta,
        [
            (lambda elapsed, done, total: elapsed / done * total, 'the time of the whole pass'),
            (
                lambda elapsed, done, total: elapsed * (total - done),
                r'should be 30\. Hint: the average time per batch',
            ),
            (lambda elapsed, done, total: f'{elapsed:.0f}s', 'should be a number'),
        ],
    ),
    (
        check_redrawn_line,
        redrawn_line,
        [
            (lambda raw: raw.split('\r')[-1], 'does not erase the line'),
            (
                lambda raw: raw.replace('\r', ''),
                r"redrawn_line\('abc\\rX'\) is 'abcX', should be 'Xbc'\. Hint",
            ),
            (lambda raw: raw.encode(), 'should be a string'),
        ],
    ),
    (
        check_conv_out_size,
        conv_out_size,
        [
            (lambda n, ks, stride, padding: (n - ks) // stride + 1, 'the padding adds'),
            (
                lambda n, ks, stride, padding: (n + 2 * padding - ks) // stride,
                r'count the first position too: \+ 1',
            ),
            (lambda n, ks, stride, padding: n // stride, 'that is the stride alone'),
            (
                lambda n, ks, stride, padding: (n + 2 * padding - ks) // stride + 2,
                r'conv_out_size\(28, 5, 2, 2\) = 15, should be 14\. Hint',
            ),
            (
                lambda n, ks, stride, padding: (n + 2 * padding - ks) / stride + 1,
                'should be an int',
            ),
        ],
    ),
    (
        check_conv_params,
        conv_params,
        [
            (lambda ni, nf, ks: ni * nf * ks * ks, 'the bias is missing'),
            (lambda ni, nf, ks: ni * nf * ks + nf, 'ks \\* ks weights'),
            (lambda ni, nf, ks: nf * ks * ks + nf, 'for every input channel'),
            (
                lambda ni, nf, ks: ni * nf * ks * ks + ni,
                r'conv_params\(1, 8, 5\) = 201, should be 208\. Hint',
            ),
        ],
    ),
    (
        check_n_batches,
        n_batches,
        [
            (lambda n, bs, drop_last: -(-n // bs), 'drop_last drops the last'),
            (
                lambda n, bs, drop_last: n // bs,
                'without drop_last the last, smaller batch counts too',
            ),
            (lambda n, bs, drop_last: n / bs, 'should be an int'),
            (lambda n, bs, drop_last: n // bs + 1, r'n_batches\(1000, 128, True\) = 8: drop_last'),
            (
                lambda n, bs, drop_last: n // bs - 1 if drop_last else -(-n // bs),
                r'n_batches\(1000, 128, True\) = 6, should be 7\. Hint',
            ),
        ],
    ),
    (
        check_epoch_loss,
        epoch_loss,
        [
            (lambda losses, sizes: losses.mean(), "the mean of the batches' means"),
            (lambda losses, sizes: (losses * sizes).sum(), 'divide it by the number of items'),
            (
                lambda losses, sizes: float((losses * sizes).sum() / sizes.sum()) * 1.01,
                r'is wrong: its element 0 .*; weight each batch',
            ),
            (
                lambda losses, sizes: losses * sizes / sizes.sum(),
                'has shape \\(8,\\), but should have shape \\(\\)',
            ),
        ],
    ),
    (
        check_cycle_lrs,
        cycle_lrs,
        [
            (lambda lr: (lr / 25, lr / 25e4), "fastai's default"),
            (lambda lr: (lr / 10, lr / 1e6), 'final_div divides the peak lr'),
            (lambda lr: (lr * 10, lr * 1e5), 'divide'),
            (
                lambda lr: (lr / 10, lr / 1e4),
                r'cycle_lrs\(0.1\) = .*, should be \(0.01, 1e-06\)\. Hint',
            ),
            (lambda lr: lr / 10, 'should be a tuple of two numbers'),
        ],
    ),
    (
        check_partial_folder,
        partial_name,
        [
            (lambda out: Path(out).with_suffix('.partial'), 'with_suffix replaces'),
            (lambda out: out + '.partial', 'should be a Path'),
            (
                lambda out: Path(out) / '.partial',
                r"partial_name\('runs/mlp'\) is 'runs/mlp/.partial', should be "
                r"'runs/mlp.partial'\. Hint",
            ),
        ],
    ),
    (
        check_rank_share,
        rank_share,
        [
            (
                lambda batch, rank, world: batch[
                    rank * len(batch) // world : (rank + 1) * len(batch) // world
                ],
                'a block of the batch',
            ),
            (
                lambda batch, rank, world: batch[rank + 1 :: world],
                r'rank_share\(\[10, .*\], 0, 2\) is .*, should be \[10, 12, 14, 16\]\. Hint',
            ),
            (lambda batch, rank, world: set(batch[rank::world]), 'should be a list'),
        ],
    ),
    (
        check_averaged_grad,
        averaged_grad,
        [
            (lambda grads, sizes: sum(grads) / len(grads), 'plain mean'),
            (lambda grads, sizes: sum(grads), 'sum of the gradients'),
            (
                lambda grads, sizes: sum(g * n for g, n in zip(grads, sizes)),
                'divide the weighted sum',
            ),
            (lambda grads, sizes: grads[0], 'is wrong: its element'),
            (lambda grads, sizes: sum(grads).sum(), 'should have shape'),
        ],
    ),
    # lesson 14
    (
        check_smooth_targets,
        smooth_targets,
        [
            (
                lambda y, c, eps: (
                    F.one_hot(y, c) * (1 - eps) + (1 - F.one_hot(y, c)) * eps / (c - 1)
                ),
                'over the other c - 1 classes',
            ),
            (
                lambda y, c, eps: F.one_hot(y, c) * (1 - eps) + (1 - F.one_hot(y, c)) * eps / c,
                "the label's class gets its share",
            ),
            (lambda y, c, eps: F.one_hot(y, c) * (1 - eps), 'each row must sum to 1'),
            (lambda y, c, eps: F.one_hot(y, c).float(), 'is wrong: its element'),
            (lambda y, c, eps: y, 'should have shape'),
        ],
    ),
    (
        check_mixup_batch,
        mixup_batch,
        [
            (_raw_mix, 'take max\\(lam, 1 - lam\\) first'),
            (lambda x, perm, lam: mixup_batch(x[perm], perm.argsort(), lam), 'goes to x itself'),
            (lambda x, perm, lam: mixup_batch(x, perm.argsort(), lam), 'not with the image'),
            (lambda x, perm, lam: x, 'is wrong: its element'),
        ],
    ),
    (
        check_tta_probs,
        tta_probs,
        [
            (
                lambda model, x: F.softmax((model(x) + model(x.flip(-1))) / 2, -1),
                'averages the logits',
            ),
            (lambda model, x: (model(x) + model(x.flip(-1))) / 2, 'those are logits'),
            (
                lambda model, x: (F.softmax(model(x), -1) + F.softmax(model(x.flip(-2)), -1)) / 2,
                'mirrors top to bottom',
            ),
            (lambda model, x: F.softmax(model(x), -1), 'prediction on x alone'),
            (lambda model, x: [0.5], 'should be a tensor'),
        ],
    ),
]
IDS = [check.__name__ for check, *_ in CHECKS]


@pytest.mark.parametrize('check, solution, wrongs', CHECKS, ids=IDS)
def test_reference_solution_passes(check, solution, wrongs, capsys):
    check(solution)
    assert capsys.readouterr().out.endswith(': correct\n')


@pytest.mark.parametrize('check, solution, wrongs', CHECKS, ids=IDS)
def test_wrong_answers_fail_with_a_hint(check, solution, wrongs, capsys):
    for wrong, hint in wrongs:
        with pytest.raises(ExerciseError, match=hint):
            check(wrong)
    assert 'correct' not in capsys.readouterr().out


@pytest.mark.parametrize('check', [c for c, *_ in CHECKS], ids=IDS)
def test_an_unanswered_exercise_is_reported_not_failed(check, capsys):
    class NotAnswered(torch.autograd.Function):  # the notebook's stub for a Function
        forward = staticmethod(lambda ctx, x: not_answered())
        backward = staticmethod(lambda ctx, g: not_answered())

    stub = {
        check_leaky_relu_function: NotAnswered,
        check_ewma_after_three: ...,
        check_adam_first_step: ...,
        check_cancelled_batch: ...,
    }.get(check, not_answered)
    assert check(stub) is None
    assert 'not answered yet' in capsys.readouterr().out


def test_numbers_as_tensors_are_accepted(capsys):
    check_ewma_after_three(torch.tensor(0.271))
    check_adam_first_step(torch.tensor(-0.0099999))
    assert capsys.readouterr().out.count('correct') == 2


def test_the_mechanism_is_still_importable_from_exp_backprop():
    assert (exp.backprop.ExerciseError, exp.backprop.exercise, exp.backprop.expect_close) == (
        ExerciseError,
        exercise,
        expect_close,
    )


def test_the_mechanism_on_its_own(capsys):
    @exercise
    def check_double(f):
        expect_close(
            f(torch.arange(3.0)),
            torch.arange(3.0) * 2,
            'f(x)',
            mistakes=[(torch.arange(3.0) ** 2, 'that squares')],
            hint='double it',
        )

    check_double(lambda x: x * 2)
    with pytest.raises(ExerciseError, match='f\\(x\\) is wrong: that squares'):
        check_double(lambda x: x**2)
    with pytest.raises(
        ExerciseError, match=r'its element 2 \(counting in order\) is 6 but should be 4; double it'
    ):
        check_double(lambda x: x * 3)
    with pytest.raises(ExerciseError, match='f\\(x\\) should be a tensor, got list'):
        check_double(lambda x: [0, 2, 4])
    # the learner's own errors come through as they are
    with pytest.raises(ZeroDivisionError):
        check_double(lambda x: 1 / 0)
    check_double(not_answered)
    out = capsys.readouterr().out
    assert out == 'double: correct\ndouble: not answered yet; fill in the cell and run it again\n'
    assert check_double.__name__ == 'check_double'


def test_expect_number_on_its_own():
    expect_number(2.5, 2.5, 'm')
    expect_number(torch.tensor(2.5), 2.5, 'm')  # a one-element tensor is a number
    expect_number(2.5 + 1e-7, 2.5, 'm')  # within rel_tol
    mistakes = [(10, 'that is the sum')]
    with pytest.raises(ExerciseError, match='^m = 10: that is the sum$'):
        expect_number(10, 2.5, 'm', mistakes)
    with pytest.raises(ExerciseError, match=r'^m = 2, should be 2\.5\. Hint: divide$'):
        expect_number(2, 2.5, 'm', mistakes, 'divide')
    with pytest.raises(ExerciseError, match='^m = 2, should be 2.5$'):
        expect_number(2, 2.5, 'm')
    with pytest.raises(ExerciseError, match='^m = 2 is wrong$'):
        expect_number(2, 2.5, 'm', reveal=False)
    with pytest.raises(ExerciseError, match="^m should be a number, got '2.5'$"):
        expect_number('2.5', 2.5, 'm')
    with pytest.raises(ExerciseError, match='^m should be a number, got True$'):
        expect_number(True, 1, 'm')
    with pytest.raises(ExerciseError, match='should be a number'):
        expect_number(torch.ones(2), 1, 'm')
    # integers: exact, and a float is not one
    expect_number(torch.tensor(7), 7, 'n', integer=True)
    with pytest.raises(ExerciseError, match='^n should be an int, got 7.0$'):
        expect_number(7.0, 7, 'n', integer=True)
    with pytest.raises(ExerciseError, match='^n = 8, should be 7$'):
        expect_number(8, 7, 'n', integer=True)
    # a mistake matched more loosely than the right answer, and abs_tol for a right answer of 0
    with pytest.raises(ExerciseError, match='^v = 0.0316: no bias correction$'):
        expect_number(0.0316, 0.01, 'v', [(0.031623, 'no bias correction')], mistake_tol=1e-2)
    with pytest.raises(ExerciseError, match='^v = 0.0316, should be 0.01$'):
        expect_number(0.0316, 0.01, 'v', [(0.031623, 'x')])
    expect_number(1e-12, 0.0, 'z', abs_tol=1e-9)


def test_the_exercise_checks_are_in_exp_exercises_alone():
    "A lesson module's __all__ lists the library only; every exercise check is in exp.exercises."
    import importlib
    import pkgutil

    import exp
    import exp.exercises

    wrapper = exercise(lambda answer: None).__code__  # the code every check made by exercise runs

    def checks(module) -> list[str]:
        return [n for n in module.__all__ if getattr(getattr(module, n), '__code__', 0) is wrapper]

    in_exercises = checks(exp.exercises)
    assert len(in_exercises) >= 30, in_exercises
    for info in pkgutil.iter_modules(exp.__path__):
        if info.name in ('exercises', '_modidx') or info.ispkg:
            continue
        module = importlib.import_module(f'exp.{info.name}')
        assert not checks(module), f'exp.{info.name} exports exercise checks: {checks(module)}'

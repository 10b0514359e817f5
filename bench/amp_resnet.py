"""The trainer's ResNet recipe (`python -m exp.train --data fashion --arch resnet`: the same data,
model, AdamW, one-cycle and seed) trained with torch.amp instead of the series' MixedPrecision:
`torch.autocast` over the forward pass and the loss, `torch.amp.GradScaler` over backward and the
step, through one callback (`TorchAmp`, below). Prints the time and the last epoch's table row, so
that bench/gpu_checks.sh can set it beside the trainer's `--fp16 off`, `on` and `bf16` runs.

On a GPU it autocasts to float16 with a GradScaler (dynamic loss scaling, as ours); on a CPU to
bfloat16 (the scaler is on too, to run the same path; bfloat16 needs none), which is how its test
runs it on a small subset.

    python bench/amp_resnet.py [--data fashion] [--arch resnet] [--epochs 5] [--seed 42]
                               [--limit N]   # the first N training and N validation images only
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exp.callbacks import AvgStatsCallback, Callback, CancelStepException, DataBunch  # noqa: E402
from exp.cnn import DeviceCallback, default_device  # noqa: E402
from exp.minibatch import Dataset, get_dls  # noqa: E402
from exp.train import ONE_CYCLE, TrainConfig, build_learner, load_databunch  # noqa: E402


class TorchAmp(Callback):
    """torch.amp as a callback: autocast from `begin_batch` to `after_loss`, the loss scaled for
    backward, the step through the GradScaler (skipped where the gradients overflow)."""

    # the batch on its device first; the table's sums take the loss before it is scaled
    run_after = (DeviceCallback, AvgStatsCallback)

    def __init__(self, device: torch.device):
        self.device_type = device.type
        self.dtype = torch.float16 if device.type == 'cuda' else torch.bfloat16
        self.scaler = torch.amp.GradScaler(device.type)
        self.autocast = None

    def begin_batch(self):
        self.autocast = torch.autocast(self.device_type, dtype=self.dtype)
        self.autocast.__enter__()

    def _leave(self):
        if self.autocast is not None:
            self.autocast.__exit__(None, None, None)
            self.autocast = None

    def after_loss(self):
        self._leave()  # backward outside autocast, as torch's recipe has it
        if self.run.in_train:
            self.unscaled = self.run.loss
            self.run.loss = self.scaler.scale(self.run.loss.float())

    def after_backward(self):
        self.run.loss = self.unscaled  # the Recorder keeps the true loss
        self.scaler.step(self.opt)  # unscales; steps unless a gradient is inf or nan
        self.scaler.update()
        raise CancelStepException()  # the step is done: the runner's own is skipped

    def after_cancel_batch(self):
        self._leave()

    def after_fit(self):
        self._leave()


def subset(data: DataBunch, n: int, bs: int) -> DataBunch:
    "The first `n` training and `n` validation images of `data`, in loaders of `bs`."
    train, valid = data.train_ds, data.valid_ds
    parts = [Dataset(ds.x[:n], ds.y[:n]) for ds in (train, valid)]
    return DataBunch(*get_dls(*parts, bs), c=data.c)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog='amp_resnet.py', description=__doc__.splitlines()[0])
    ap.add_argument('--data', default='fashion')
    ap.add_argument('--arch', default='resnet')
    ap.add_argument('--epochs', type=int, default=5)
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--limit', type=int, default=0, help='images per split (0: all)')
    args = ap.parse_args(argv)
    cfg = TrainConfig(data=args.data, arch=args.arch, epochs=args.epochs, seed=args.seed)
    cfg = cfg.check()
    data = load_databunch(cfg.data, cfg.bs)
    if args.limit:
        data = subset(data, args.limit, cfg.bs)
    learn = build_learner(cfg, data)
    learn.display = 'off'
    device = default_device()
    t0 = time.perf_counter()
    learn.fit_one_cycle(cfg.epochs, max_lr=cfg.lr or learn.lr, cbs=[TorchAmp(device)], **ONE_CYCLE)
    if device.type == 'cuda':
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    last = learn.run.avg_stats.history[-1]
    dtype = 'float16' if device.type == 'cuda' else 'bfloat16'
    print(f"torch.amp ({dtype} autocast, GradScaler) on {device}: {cfg.arch} on {cfg.data}")
    print(f"valid accuracy: {last['valid_accuracy']:.4f} after epoch {last['epoch']}, {wall:.1f} s")


if __name__ == '__main__':
    main()

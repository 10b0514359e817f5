"""Other training loops on the work of bench_overhead.py: plain PyTorch (torch's DataLoader and
OneCycleLR), Lightning and fastai, each written as its documentation has it: the MLP 784-50-10, bs
64, SGD with momentum 0.9, one-cycle to lr 0.1 (their own one-cycle schedules, with their defaults
where ours has no counterpart), loss and accuracy. Lightning and fastai are optional (`pip install
torch==2.13.0 -e ".[peers]"`; the README's "The training loop's overhead" says more): one that is
missing, or fails to import, is reported with the reason and skipped."""

import logging
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader as TorchDataLoader, TensorDataset


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10))


def _torch_loaders(x, y, xv, yv, bs):
    g = torch.Generator().manual_seed(0)
    return (
        TorchDataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True, generator=g),
        TorchDataLoader(TensorDataset(xv, yv), batch_size=bs * 2),
    )


def plain_pytorch(x, y, xv, yv, bs, lr, moms, div, pct_start):
    "torch's DataLoader, optim.SGD and OneCycleLR, with the same sums as the hand loop."

    def run():
        model = _mlp()
        train_dl, valid_dl = _torch_loaders(x, y, xv, yv, bs)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=moms[0])
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt,
            lr,
            total_steps=len(train_dl),
            pct_start=pct_start,
            div_factor=div,
            final_div_factor=1e4,
            base_momentum=moms[1],
            max_momentum=moms[0],
        )
        sums = torch.zeros(4)
        model.train()
        for xb, yb in train_dl:
            pred = model(xb)
            loss = F.cross_entropy(pred, yb)
            with torch.no_grad():
                sums[0].add_(loss, alpha=len(xb))
                sums[1].add_((pred.argmax(1) == yb).sum())
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        model.eval()
        with torch.no_grad():
            for xb, yb in valid_dl:
                pred = model(xb)
                sums[2].add_(F.cross_entropy(pred, yb), alpha=len(xb))
                sums[3].add_((pred.argmax(1) == yb).sum())
        return sums

    return run


def lightning(x, y, xv, yv, bs, lr, moms, div, pct_start):
    """A LightningModule logging loss and accuracy per epoch for training and validation; Trainer
    without bar or logger."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _mlp()

        def _step(self, batch, split):
            xb, yb = batch
            pred = self.model(xb)
            loss = F.cross_entropy(pred, yb)
            self.log(f'{split}_loss', loss, on_step=False, on_epoch=True)
            self.log(
                f'{split}_accuracy',
                (pred.argmax(1) == yb).float().mean(),
                on_step=False,
                on_epoch=True,
            )
            return loss

        def training_step(self, batch, i):
            return self._step(batch, 'train')

        def validation_step(self, batch, i):
            self._step(batch, 'valid')

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=lr, momentum=moms[0])
            sched = torch.optim.lr_scheduler.OneCycleLR(
                opt,
                lr,
                total_steps=self.trainer.estimated_stepping_batches,
                pct_start=pct_start,
                div_factor=div,
                final_div_factor=1e4,
                base_momentum=moms[1],
                max_momentum=moms[0],
            )
            return {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'interval': 'step'}}

    logging.getLogger('lightning.pytorch').setLevel(logging.ERROR)
    warnings.filterwarnings('ignore', message='.*(num_workers|does not have many workers).*')
    # Lightning's own use of a torch API
    warnings.filterwarnings(
        'ignore', message='.*isinstance\\(treespec, LeafSpec\\)', category=FutureWarning
    )

    def run():
        train_dl, valid_dl = _torch_loaders(x, y, xv, yv, bs)
        trainer = L.Trainer(
            max_epochs=1,
            accelerator='cpu',
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(Module(), train_dl, valid_dl)
        return trainer.callback_metrics

    return run


def fastai(x, y, xv, yv, bs, lr, moms, div, pct_start):
    """fastai's Learner and fit_one_cycle on its DataLoaders over the tensors, accuracy as its
    metric, no bar."""
    from fastai.basics import DataLoaders, Learner, accuracy
    from fastai.callback.schedule import fit_one_cycle  # noqa: F401  (adds it to Learner)
    from fastai.optimizer import SGD

    train, valid = list(zip(x, y)), list(zip(xv, yv))

    def run():
        torch.manual_seed(0)
        dls = DataLoaders.from_dsets(train, valid, bs=bs, device='cpu')
        learn = Learner(
            dls, _mlp(), loss_func=F.cross_entropy, opt_func=SGD, metrics=accuracy, wd=0.0
        )
        with learn.no_bar(), learn.no_logging():
            learn.fit_one_cycle(
                1, lr, div=div, pct_start=pct_start, moms=(moms[0], moms[1], moms[0])
            )
        return learn.recorder.values

    return run


def contenders(x, y, xv, yv, bs, lr, moms, div, pct_start) -> dict:
    "Each peer's run (a function) by name, or for a peer that cannot run here, why (a string)."
    out = {}
    for name, make in (
        ('plain_pytorch', plain_pytorch),
        ('lightning', lightning),
        ('fastai', fastai),
    ):
        try:
            fn = make(x, y, xv, yv, bs, lr, moms, div, pct_start)
            fn()  # one run: a peer that imports but fails to train is reported, not timed
            out[name] = fn
        # ImportError, or a broken install (a torchvision built for another torch)
        except Exception as e:
            out[name] = f'skipped ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""})'
    return out

"""Our DataLoader against torch's DataLoader(TensorDataset, batch_size=64, shuffle=True): one epoch
of data over 60,000 x 784 in memory, no training. Target: ours at least 5x faster."""

import torch
from torch.utils.data import DataLoader as TorchDataLoader, TensorDataset

from common import fashion_or_random, median_times, report
from exp.minibatch import DataLoader, Dataset, Sampler

x, y, _, _, data_name = fashion_or_random()
ours = DataLoader(Dataset(x, y), Sampler(range(len(x)), 64, shuffle=True, seed=0))
ours_items = DataLoader(
    Dataset(x, y), Sampler(range(len(x)), 64, shuffle=True, seed=0), batch_index=False
)
theirs = TorchDataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)


def epoch(dl):
    for xb, yb in dl:
        pass


report('data', data_name)
report('torch_threads', torch.get_num_threads())
t_ours, t_items, t_torch = median_times(
    *(lambda dl=dl: epoch(dl) for dl in (ours, ours_items, theirs))
)
report('dataloader_epoch_ours_s', t_ours)
report('dataloader_epoch_ours_item_by_item_s', t_items)
report('dataloader_epoch_torch_s', t_torch)
report('dataloader_speedup_vs_torch', t_torch / t_ours, '.1f')

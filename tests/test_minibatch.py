"""Unit tests for exp.minibatch, each piece against its PyTorch counterpart."""

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st
from torch import nn, optim
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, TensorDataset
from torch.utils.data import DataLoader as TorchDataLoader

from exp.data import get_data, normalize, set_seed
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Optimizer, Sampler, collate, fit, get_dls


def mlp(n_in=784, nh=50, n_out=10):
    return nn.Sequential(nn.Linear(n_in, nh), nn.ReLU(), nn.Linear(nh, n_out))


@pytest.fixture(scope='module')
def mnist():
    x_train, y_train, x_valid, y_valid = get_data()
    mean, std = x_train.mean(), x_train.std()
    return Dataset(normalize(x_train, mean, std), y_train), Dataset(
        normalize(x_valid, mean, std), y_valid
    )


# ---------------- Optimizer


def test_optimizer_equals_sgd():
    x, y = torch.randn(200, 20), torch.randint(0, 3, (200,))
    models = []
    for opt_func in (Optimizer, optim.SGD):
        set_seed(0)
        model = mlp(20, 8, 3)
        opt = opt_func(model.parameters(), lr=0.3)
        for i in range(0, 200, 25):
            F.cross_entropy(model(x[i : i + 25]), y[i : i + 25]).backward()
            opt.step()
            opt.zero_grad()
        models.append(model)
    for p, q in zip(*(m.parameters() for m in models)):
        ft.test_close(p, q, eps=1e-6)
    assert not all(
        torch.equal(p, q) for p, q in zip(models[0].parameters(), mlp(20, 8, 3).parameters())
    )


def test_optimizer_param_groups_and_zero_grad():
    w = nn.Parameter(torch.ones(3))
    opt = Optimizer([w], lr=0.1)
    (w * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    opt.param_groups[0]['lr'] = 1.0  # a scheduler changes the lr through the group
    opt.step()
    ft.test_close(w, torch.tensor([0.0, -1.0, -2.0]))
    opt.zero_grad()
    assert w.grad is None
    opt.step()  # parameters without gradients are left alone
    ft.test_close(w, torch.tensor([0.0, -1.0, -2.0]))


def test_optimizer_bad_input():
    with pytest.raises(ValueError, match='params is empty'):
        Optimizer([], 0.1)
    with pytest.raises(ValueError, match='lr must be >= 0, got -1'):
        Optimizer([nn.Parameter(torch.ones(1))], -1)


# ---------------- Dataset and Sampler


def test_dataset():
    ds = Dataset(torch.arange(10) * 2, torch.arange(10))
    ft.test_eq(len(ds), 10)
    ft.test_eq(ds[3], (torch.tensor(6), torch.tensor(3)))
    ft.test_eq(ds[torch.tensor([1, 4])], (torch.tensor([2, 8]), torch.tensor([1, 4])))
    # every kind of index gives what indexing x and y gives: int64 batches (the index_select path),
    # others
    for idx in (
        torch.tensor([7, 0, 7]),
        torch.tensor([2, 5], dtype=torch.int32),
        torch.arange(10) % 3 == 0,
        slice(2, 5),
        -1,
    ):
        ft.test_eq(ds[idx], (ds.x[idx], ds.y[idx]))
    with pytest.raises(ValueError, match=r'len\(x\)=10, len\(y\)=9'):
        Dataset(torch.zeros(10), torch.zeros(9))
    with pytest.raises(ValueError, match='x is empty'):
        Dataset(torch.zeros(0, 3), torch.zeros(0))


@pytest.mark.parametrize('bs', [0, -1, 2.5, None, True, False])
def test_sampler_bad_bs(bs):
    "Refused, a bool too: True is an int to Python, and would be a batch of one."
    with pytest.raises(ValueError, match=f'bs must be a positive int, got {bs!r}'):
        Sampler(range(5), bs)


@pytest.mark.parametrize('seed', [1.5, True, -1, 2**63, '0'])
def test_sampler_bad_seed(seed):
    "The same range as set_seed's, checked before torch's generator sees it."
    with pytest.raises(
        ValueError, match=f'seed must be an int from 0 to 2\\*\\*63 - 1, or None, got {seed!r}'
    ):
        Sampler(range(5), 2, shuffle=True, seed=seed)
    # the largest seed is fine
    ft.test_eq(len(list(Sampler(range(5), 2, shuffle=True, seed=2**63 - 1))), 3)


def test_sampler_empty():
    with pytest.raises(ValueError, match='ds is empty'):
        Sampler([], 4)
    with pytest.raises(ValueError, match='ds is empty'):
        DataLoader([], Sampler(range(3), 1))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 64), st.booleans())
def test_sampler_sequential_equals_torch(n, bs, drop_last):
    ds = range(n)
    ours = [b.tolist() for b in Sampler(ds, bs, drop_last=drop_last)]
    theirs = list(BatchSampler(SequentialSampler(ds), bs, drop_last=drop_last))
    assert ours == theirs
    assert len(Sampler(ds, bs, drop_last=drop_last)) == len(theirs)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 64), st.booleans(), st.integers(0, 2**31))
def test_sampler_shuffle_covers_like_random_sampler(n, bs, drop_last, seed):
    sampler = Sampler(range(n), bs, shuffle=True, drop_last=drop_last, seed=seed)
    theirs = list(BatchSampler(RandomSampler(range(n)), bs, drop_last=drop_last))
    for _ in range(2):  # every epoch
        batches = list(sampler)
        assert [len(b) for b in batches] == [len(b) for b in theirs]
        seen = torch.cat(batches) if batches else torch.tensor([], dtype=torch.long)
        assert len(set(seen.tolist())) == len(seen)  # no index twice
        if not drop_last:
            assert sorted(seen.tolist()) == list(range(n))  # every index once


def test_sampler_reshuffles_each_epoch_and_repeats_with_seed():
    a, b = (
        Sampler(range(100), 10, shuffle=True, seed=5),
        Sampler(range(100), 10, shuffle=True, seed=5),
    )
    epochs_a, epochs_b = (
        [torch.cat(list(a)) for _ in range(3)],
        [torch.cat(list(b)) for _ in range(3)],
    )
    for e, f in zip(epochs_a, epochs_b):
        ft.test_eq(e, f)
    assert not torch.equal(epochs_a[0], epochs_a[1]) and not torch.equal(epochs_a[1], epochs_a[2])


def test_sampler_follows_set_seed():
    runs = []
    for _ in range(2):
        set_seed(11)
        runs.append(torch.cat(list(Sampler(range(50), 7, shuffle=True))))
    ft.test_eq(runs[0], runs[1])


# ---------------- collate and DataLoader


def test_collate():
    xb, yb = collate(
        [(torch.tensor([1, 2]), torch.tensor(0)), (torch.tensor([3, 4]), torch.tensor(1))]
    )
    ft.test_eq(xb, torch.tensor([[1, 2], [3, 4]]))
    ft.test_eq(yb, torch.tensor([0, 1]))


class ListDataset:
    "A dataset of python lists: items only, no batch indexing."

    def __init__(self, x, y):
        self.x, self.y = x.tolist(), y.tolist()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.tensor(self.x[i]), torch.tensor(self.y[i])


class ItemTransformDataset(Dataset):
    "A per-item transform that would silently give a wrong batch if applied to a tensor of indices."

    def __getitem__(self, i):
        return self.x[i].reshape(2, 2), self.y[i]


@pytest.mark.parametrize(
    'make, expected',
    [
        (lambda x, y: Dataset(x, y), True),
        (lambda x, y: TensorDataset(x, y), True),
        (lambda x, y: ListDataset(x, y), False),
        (lambda x, y: ItemTransformDataset(x, y), False),
    ],
)
def test_dataloader_paths_give_the_same_batches(make, expected):
    x, y = torch.randn(23, 4), torch.randint(0, 5, (23,))
    ds = make(x, y)
    auto = DataLoader(ds, Sampler(ds, 5, shuffle=True, seed=3))
    items = DataLoader(ds, Sampler(ds, 5, shuffle=True, seed=3), batch_index=False)
    assert auto.batch_index is expected and items.batch_index is False
    batches = list(zip(auto, items))
    ft.test_eq(len(batches), 5)  # the last batch is ragged: 3 items
    ft.test_eq(len(batches[-1][0][0]), 3)
    for (xa, ya), (xb, yb) in batches:
        ft.test_eq(xa, xb)
        ft.test_eq(ya, yb)
    fresh = DataLoader(ds, Sampler(ds, 5, shuffle=True, seed=3))
    for idxs, (xb, yb) in zip(Sampler(ds, 5, shuffle=True, seed=3), fresh):
        ft.test_eq(yb, y[idxs])


def test_dataloader_equals_torch_sequential():
    x, y = torch.randn(50, 3), torch.arange(50)
    ours = list(DataLoader(Dataset(x, y), Sampler(range(50), 8)))
    theirs = list(TorchDataLoader(TensorDataset(x, y), batch_size=8))
    ft.test_eq(len(ours), len(theirs))
    for (xa, ya), (xb, yb) in zip(ours, theirs):
        ft.test_eq(xa, xb)
        ft.test_eq(ya, yb)


def test_dataloader_custom_collate_uses_items():
    ds = Dataset(torch.arange(6), torch.arange(6))
    dl = DataLoader(ds, Sampler(ds, 4), collate_fn=lambda items: [int(x) for x, _ in items])
    assert not dl.batch_index
    ft.test_eq(list(dl), [[0, 1, 2, 3], [4, 5]])


def test_get_dls(mnist):
    train_ds, valid_ds = mnist
    train_dl, valid_dl = get_dls(train_ds, valid_ds, 64)
    assert train_dl.sampler.shuffle and not valid_dl.sampler.shuffle
    ft.test_eq((train_dl.sampler.bs, valid_dl.sampler.bs), (64, 128))
    ft.test_eq(len(valid_dl), 8)


# ---------------- fit


def test_fit_validation_is_weighted_by_batch_size(mnist):
    train_ds, valid_ds = mnist
    set_seed(0)
    model = mlp()
    # 300, 300, 300, 100: a ragged last batch
    valid_dl = DataLoader(valid_ds, Sampler(valid_ds, 300))
    train_dl = DataLoader(train_ds, Sampler(train_ds, 64, shuffle=True))
    loss, acc = fit(
        1,
        model,
        F.cross_entropy,
        Optimizer(model.parameters(), 0.5),
        train_dl,
        valid_dl,
        verbose=False,
    )
    model.eval()
    with torch.no_grad():
        pred = model(valid_ds.x)
    ft.test_close(loss, F.cross_entropy(pred, valid_ds.y).item(), eps=1e-5)
    ft.test_close(acc, accuracy(pred, valid_ds.y).item(), eps=1e-7)
    # the per-batch average the course used is measurably different here: the test can tell them
    # apart
    with torch.no_grad():
        per_batch = (
            torch.stack([F.cross_entropy(model(xb), yb) for xb, yb in valid_dl]).mean().item()
        )
    assert abs(per_batch - loss) > 1e-4


def test_fit_same_weights_as_hand_written_loop(mnist):
    train_ds, valid_ds = mnist
    set_seed(3)
    model_a = mlp()
    set_seed(3)
    model_b = mlp()
    sampler_seed, lr = 9, 0.4
    fit(
        2,
        model_a,
        F.cross_entropy,
        Optimizer(model_a.parameters(), lr),
        DataLoader(train_ds, Sampler(train_ds, 64, shuffle=True, seed=sampler_seed)),
        DataLoader(valid_ds, Sampler(valid_ds, 128)),
        verbose=False,
    )
    replay = Sampler(train_ds, 64, shuffle=True, seed=sampler_seed)
    for _ in range(2):
        for idxs in replay:
            F.cross_entropy(model_b(train_ds.x[idxs]), train_ds.y[idxs]).backward()
            with torch.no_grad():
                for p in model_b.parameters():
                    p -= p.grad * lr
            model_b.zero_grad()
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        ft.test_eq(p.detach(), q.detach())


def test_fit_modes():
    class Spy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.modes = nn.Linear(2, 2), []

        def forward(self, x):
            self.modes.append((self.training, torch.is_grad_enabled()))
            return self.lin(x)

    ds = Dataset(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]))
    model = Spy()
    fit(
        1,
        model,
        F.cross_entropy,
        Optimizer(model.parameters(), 0.1),
        DataLoader(ds, Sampler(ds, 2)),
        DataLoader(ds, Sampler(ds, 4)),
        verbose=False,
    )
    ft.test_eq(model.modes, [(True, True), (True, True), (False, False)])


def test_fit_bad_epochs():
    with pytest.raises(ValueError, match='epochs must be an int >= 0, got -1'):
        fit(-1, None, None, None, [], [])


def test_fit_with_no_validation_batches():
    model = mlp(5, 4, 3)
    batch = (torch.randn(8, 5), torch.randint(0, 3, (8,)))
    with pytest.raises(ValueError, match='valid_dl gave no batches'):
        fit(
            1,
            model,
            F.cross_entropy,
            Optimizer(model.parameters(), 0.1),
            [batch],
            [],
            verbose=False,
        )


def test_mlp_accuracy_on_embedded_data(mnist, capsys):
    # seed 42, lr 0.2, bs 64, 5 epochs (0.91-0.94 over seeds 0-9); threshold 0.90
    train_ds, valid_ds = mnist
    set_seed(42)
    model = mlp()
    loss, acc = fit(
        5,
        model,
        F.cross_entropy,
        Optimizer(model.parameters(), 0.2),
        *get_dls(train_ds, valid_ds, 64),
    )
    assert acc >= 0.90, acc
    assert capsys.readouterr().out.count('valid loss') == 5


def test_flags_and_containers_are_what_they_say():
    "shuffle='no' is true to Python and would shuffle; a list-backed Dataset failed at a batch."
    ft.test_fail(lambda: Sampler(range(4), 2, shuffle='no'), contains="shuffle must be True or")
    ft.test_fail(lambda: Sampler(range(4), 2, drop_last=1), contains="drop_last must be True or")
    ft.test_fail(lambda: Dataset([1.0, 2.0], torch.tensor([0, 1])), contains="x must be a tensor")
    ft.test_fail(lambda: Dataset(torch.zeros(2, 3), [0, 1]), contains="y must be a tensor")


# ---------------- the lesson's committed outputs


def test_the_lesson_plots_its_first_loss_curve_and_prints_no_log_twice():
    "03's first run of fit is followed by its labelled loss curve; no cell repeats a training log."
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / 'nbs' / '03_minibatch_training.ipynb'
    cells = [c for c in json.loads(path.read_text())['cells'] if c['cell_type'] == 'code']
    source = lambda c: ''.join(c['source'])
    first_fit = next(i for i, c in enumerate(cells) if 'fit(5, model' in source(c))
    assert 'train_losses.append' in source(cells[first_fit])
    plot = cells[first_fit + 1]
    assert 'ax.plot(train_losses' in source(plot) and "xlabel='batch" in source(plot)
    assert any('image/png' in o.get('data', {}) for o in plot['outputs'])
    for cell in cells:
        text = ''.join(''.join(o.get('text', '')) for o in cell['outputs'])
        lines = [line for line in text.splitlines() if line.startswith('epoch ')]
        assert len(lines) == len(set(lines)), source(cell).splitlines()[:2]

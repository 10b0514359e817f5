"""Unit tests for exp.callbacks: the Runner's event protocol, cancellation, state, and AvgStats."""

import pytest
import torch
import torch.nn.functional as F
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from torch import nn

from exp.callbacks import (
    EVENTS,
    AvgStats,
    AvgStatsCallback,
    Callback,
    CancelBatchException,
    CancelEpochException,
    CancelStepException,
    CancelTrainException,
    DataBunch,
    Learner,
    Runner,
    TrainEvalCallback,
    callback_states,
    camel2snake,
    create_learner,
    get_model_func,
    load_callback_states,
    print_row,
    sort_callbacks,
)
from exp.data import set_seed
from exp.loss import accuracy
from exp.minibatch import DataLoader, Dataset, Sampler
from exp.optimizers import SGD

TRAIN = ['begin_batch', 'after_pred', 'after_loss', 'after_backward', 'after_step', 'after_batch']
VALID = ['begin_batch', 'after_pred', 'after_loss', 'after_batch']


def make_data(n_train=8, n_valid=6, bs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = (
        torch.randn(n_train + n_valid, 5, generator=g),
        torch.randint(0, 3, (n_train + n_valid,), generator=g),
    )
    train_ds, valid_ds = Dataset(x[:n_train], y[:n_train]), Dataset(x[n_train:], y[n_train:])
    return DataBunch(
        DataLoader(train_ds, Sampler(train_ds, bs)),
        DataLoader(valid_ds, Sampler(valid_ds, bs)),
        c=3,
    )


def make_learner(data=None, seed=0, **kwargs):
    set_seed(seed)
    return Learner(
        data or make_data(),
        nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)),
        lr=0.1,
        **kwargs,
    )


class EventLog(Callback):
    """Records every event it sees; `raise_at` maps an event (and an occurrence) to an exception to
    raise."""

    def __init__(self, raise_at=None):
        self.log, self.raise_at, self.seen = [], raise_at or {}, {}


def _handler(event):
    def handler(self):
        self.log.append(event)
        self.seen[event] = self.seen.get(event, 0) + 1
        exc = self.raise_at.get((event, self.seen[event])) or self.raise_at.get(event)
        if exc:
            raise exc()

    return handler


for _event in EVENTS:
    setattr(EventLog, _event, _handler(_event))


def run_log(epochs=1, raise_at=None, data=None):
    run = Runner(cbs=[EventLog(raise_at)])
    learn = make_learner(data)
    return run, learn


def fit_log(epochs=1, raise_at=None, data=None):
    run, learn = run_log(epochs, raise_at, data)
    run.fit(epochs, learn)
    return run.event_log.log


# ---------------- the event protocol


def test_event_sequence():
    # 8 training items and 6 validation items in batches of 4: 2 training batches, 2 validation
    # batches
    ft.test_eq(
        fit_log(2),
        ['begin_fit']
        + 2 * (['begin_epoch'] + 2 * TRAIN + ['begin_validate'] + 2 * VALID + ['after_epoch'])
        + ['after_fit'],
    )


def test_zero_epochs():
    ft.test_eq(fit_log(0), ['begin_fit', 'after_fit'])


def test_callbacks_run_in_order():
    calls = []

    class A(Callback):
        _order = 5

        def begin_batch(self):
            calls.append('a')

    class B(Callback):
        _order = -3

        def begin_batch(self):
            calls.append('b')

    class C(Callback):
        def begin_batch(self):
            calls.append('c')

    Runner(cbs=[A(), C()], cb_funcs=[B]).fit(1, make_learner(make_data(4, 4, 4)))
    ft.test_eq(calls, ['b', 'c', 'a', 'b', 'c', 'a'])  # one train batch, one valid batch


# ---------------- cancellation


def test_cancel_step_skips_only_the_step():
    learn = make_learner()
    before = [p.detach().clone() for p in learn.model.parameters()]
    run = Runner(cbs=[EventLog({'after_backward': CancelStepException})])
    run.fit(1, learn)
    ft.test_eq(
        run.event_log.log[1 : 1 + 7],
        [
            'begin_epoch',
            'begin_batch',
            'after_pred',
            'after_loss',
            'after_backward',
            'after_cancel_step',
            'after_batch',
        ],
    )
    assert 'after_step' not in run.event_log.log
    # no step ever happened
    for p, q in zip(before, learn.model.parameters()):
        ft.test_eq(p, q.detach())
    assert all(p.grad is None for p in learn.model.parameters())  # gradients were still cleared
    ft.test_eq(run.n_iter, 2)  # the batches themselves ran


def test_cancel_batch():
    log = fit_log(1, {('begin_batch', 1): CancelBatchException})
    ft.test_eq(
        log[:6],
        [
            'begin_fit',
            'begin_epoch',
            'begin_batch',
            'after_cancel_batch',
            'after_batch',
            'begin_batch',
        ],
    )
    ft.test_eq(log.count('after_pred'), 3)  # the other 3 batches ran in full


def test_cancel_epoch_goes_to_after_epoch_and_the_next_epoch():
    log = fit_log(2, {('after_loss', 1): CancelEpochException})
    i = log.index('after_cancel_epoch')
    ft.test_eq(
        log[i - 1 : i + 3], ['after_loss', 'after_cancel_epoch', 'after_epoch', 'begin_epoch']
    )
    ft.test_eq(log.count('begin_validate'), 1)  # the first epoch's validation was skipped
    ft.test_eq(log[-1], 'after_fit')


def test_cancel_epoch_during_validation():
    log = fit_log(1, {'begin_validate': CancelEpochException})
    ft.test_eq(
        log[-5:],
        ['after_batch', 'begin_validate', 'after_cancel_epoch', 'after_epoch', 'after_fit'],
    )


def test_cancel_train():
    log = fit_log(3, {('after_step', 1): CancelTrainException})
    ft.test_eq(
        log,
        [
            'begin_fit',
            'begin_epoch',
            'begin_batch',
            'after_pred',
            'after_loss',
            'after_backward',
            'after_step',
            'after_cancel_train',
            'after_fit',
        ],
    )


def test_cancel_train_in_begin_fit():
    ft.test_eq(
        fit_log(2, {'begin_fit': CancelTrainException}),
        ['begin_fit', 'after_cancel_train', 'after_fit'],
    )


class Boom(Exception):
    pass


@pytest.mark.parametrize('event', ['begin_fit', 'after_loss', 'begin_validate', 'after_epoch'])
def test_other_exceptions_propagate_after_after_fit(event):
    run, learn = run_log(raise_at={event: Boom})
    with pytest.raises(Boom):
        run.fit(2, learn)
    ft.test_eq(run.event_log.log[-2:], [event, 'after_fit'])


def test_keyboard_interrupt_runs_after_fit():
    run, learn = run_log(raise_at={('begin_batch', 2): KeyboardInterrupt})
    with pytest.raises(KeyboardInterrupt):
        run.fit(1, learn)
    ft.test_eq(run.event_log.log[-1], 'after_fit')


# ---------------- state


def test_callbacks_read_and_change_runner_state():
    seen = {}

    class Scale(Callback):
        def begin_batch(self):
            seen.setdefault('xb', self.xb.clone())
            self.run.xb = self.xb * 0  # a callback replaces the input

        def after_pred(self):
            seen.setdefault('pred', self.pred)

        def after_loss(self):
            if self.in_train:
                self.run.loss = self.loss * 0  # and the loss: no gradient, no change

        def after_fit(self):
            seen.update(model=self.model, opt=self.opt, data=self.data, epochs=self.epochs)

    learn = make_learner()
    before = [p.detach().clone() for p in learn.model.parameters()]
    Runner(cbs=[Scale()]).fit(2, learn)
    # with zero inputs the first layer's weights get zero gradient; with a zero loss nothing moves
    # at all
    for p, q in zip(before, learn.model.parameters()):
        ft.test_eq(p, q.detach())
    # the prediction is that of a zero input: the replaced xb is what the model saw
    ft.test_close(seen['pred'][0], learn.model(torch.zeros(1, 5))[0].detach())
    assert seen['model'] is learn.model and seen['opt'] is learn.opt and seen['data'] is learn.data
    ft.test_eq(seen['epochs'], 2)


def test_train_eval_counters():
    progress = []

    class Watch(Callback):
        _order = 1

        def after_batch(self):
            progress.append((self.in_train, self.model.training, self.n_epochs, self.n_iter))

    run = Runner(cbs=[Watch()])
    run.fit(2, make_learner())
    ft.test_eq(
        progress,
        [
            (True, True, 0.5, 1),
            (True, True, 1.0, 2),
            (False, False, 1.0, 2),
            (False, False, 1.0, 2),
            (True, True, 1.5, 3),
            (True, True, 2.0, 4),
            (False, False, 2.0, 4),
            (False, False, 2.0, 4),
        ],
    )


def test_validation_runs_without_grad():
    grads = []

    class Watch(Callback):
        def after_pred(self):
            grads.append((self.in_train, torch.is_grad_enabled()))

    Runner(cbs=[Watch()]).fit(1, make_learner())
    ft.test_eq(grads, [(True, True), (True, True), (False, False), (False, False)])


# ---------------- names, typos, learner callbacks


def test_names():
    ft.test_eq(camel2snake('AvgStatsCallback'), 'avg_stats_callback')
    ft.test_eq(camel2snake('LRFinder'), 'lr_finder')
    ft.test_eq(AvgStatsCallback().name, 'avg_stats')
    ft.test_eq(TrainEvalCallback().name, 'train_eval')
    ft.test_eq(Callback().name, 'callback')
    run = Runner(cbs=[EventLog()], cb_funcs=AvgStatsCallback)
    assert isinstance(run.train_eval, TrainEvalCallback) and isinstance(run.event_log, EventLog)
    assert isinstance(run.avg_stats, AvgStatsCallback)


@pytest.mark.parametrize(
    'typo, hint',
    [
        ('begin_epcoh', "did you mean 'begin_epoch'"),
        ('after_bacth', "did you mean 'after_batch'"),
        ('afterfit', "did you mean 'after_fit'"),
        ('begin_training', 'events are: begin_fit'),
        ('before_batch', "did you mean 'begin_batch'"),
        ('before_fit', "did you mean 'begin_fit'"),
        ('before_anything', 'events are: begin_fit'),
    ],
)
def test_misspelt_events_are_reported(typo, hint):
    bad = type('Bad', (Callback,), {typo: lambda self: None})
    with pytest.raises(ValueError, match=f'Bad.{typo} looks like an event but is not one') as info:
        Runner(cbs=[bad()])
    assert hint in str(info.value)
    learn = make_learner(cbs=[bad()])
    with pytest.raises(ValueError, match=typo):
        Runner().fit(1, learn)


def test_callback_name_clash():
    class Model(Callback):
        pass

    with pytest.raises(ValueError, match="cannot be named 'model'"):
        Runner(cbs=[Model()])
    with pytest.raises(TypeError, match='Callback instances'):
        Runner(cbs=[object()])


def test_learner_cbs_and_metrics_join_the_fit(capsys):
    log = EventLog()
    learn = make_learner(cbs=[log], metrics=[accuracy])
    run = Runner()
    run.fit(1, learn)
    assert run.event_log is log and log.log[0] == 'begin_fit'
    assert isinstance(run.avg_stats, AvgStatsCallback)
    out = capsys.readouterr().out.splitlines()
    ft.test_eq(
        out[0].split(),
        ['epoch', 'train_loss', 'train_accuracy', 'valid_loss', 'valid_accuracy', 'time'],
    )
    ft.test_eq(len(out), 2)
    run.fit(1, learn)  # a second fit does not add them twice
    ft.test_eq(len(run.cbs), 3)


def test_learner_checks_and_builds_its_optimizer():
    learn = make_learner()
    assert isinstance(learn.opt, SGD) and learn.opt is learn.opt
    ft.test_eq(learn.opt.param_groups[0]['lr'], 0.1)
    with pytest.raises(TypeError, match='model must be an nn.Module'):
        Learner(make_data(), lambda x: x)
    for lr in (0, -0.1, float('inf'), float('nan'), True, '0.1'):
        with pytest.raises(ValueError, match=f'lr must be a finite number > 0, got {lr!r}'):
            Learner(make_data(), nn.Linear(5, 3), lr=lr)
    with pytest.raises(TypeError, match='data must be a DataBunch'):
        Learner(None, nn.Linear(5, 3))
    with pytest.raises(TypeError, match='metrics must be functions'):
        Learner(make_data(), nn.Linear(5, 3), metrics=[1])
    with pytest.raises(TypeError, match='callbacks must be Callback instances, got 1'):
        Learner(make_data(), nn.Linear(5, 3), cbs=[1])
    with pytest.raises(ValueError, match='epochs must be an int >= 0, got -2'):
        Runner().fit(-2, learn)


def test_create_learner():
    data = make_data()
    learn = create_learner(get_model_func(0.3), F.cross_entropy, data)
    ft.test_eq(learn.opt.param_groups[0]['lr'], 0.3)
    ft.test_eq(learn.model(torch.zeros(2, 5)).shape, (2, 3))


# ---------------- AvgStats


def test_avg_stats_weighted_by_batch_size(capsys):
    data = make_data(n_train=8, n_valid=6, bs=4)  # valid batches of 4 and 2
    learn = make_learner(data, metrics=[accuracy])
    run = Runner()
    run.fit(1, learn)
    learn.model.eval()
    with torch.no_grad():
        pred = learn.model(data.valid_ds.x)
    loss, acc = run.avg_stats.valid_stats.avg_stats
    ft.test_close(loss, F.cross_entropy(pred, data.valid_ds.y).item(), eps=1e-6)
    ft.test_close(acc, accuracy(pred, data.valid_ds.y).item(), eps=1e-6)
    ft.test_eq(run.avg_stats.valid_stats.count, 6)
    row = run.avg_stats.history[0]
    ft.test_eq(row['valid_loss'], loss)
    ft.test_eq(row['epoch'], 0)


def test_avg_stats_silent():
    cb = AvgStatsCallback([accuracy], print_stats=False)
    Runner(cbs=[cb]).fit(1, make_learner())
    ft.test_eq(len(cb.history), 1)
    assert all(v != v for v in AvgStats([accuracy], True).avg_stats)  # nan before any batch


def test_avg_stats_sums_exactly():
    """Accuracy is summed as counts (exact for any batch size); the loss in place, as the float64
    sum to fp32 precision."""
    # batches of 7 (not a power of two) and a last one of 2
    data = make_data(n_train=30, n_valid=23, bs=7)
    learn = make_learner(data, metrics=[accuracy])
    run = Runner()
    run.fit(1, learn)
    learn.model.eval()
    with torch.no_grad():
        preds = [learn.model(xb) for xb, _ in data.valid_dl]
    labels = [yb for _, yb in data.valid_dl]
    correct = sum(int((p.argmax(1) == y).sum()) for p, y in zip(preds, labels))
    loss_sum = sum(F.cross_entropy(p, y).double() * len(y) for p, y in zip(preds, labels))
    stats = run.avg_stats.valid_stats
    ft.test_eq(stats.tot_mets[0], torch.tensor(float(correct)))
    ft.test_eq(run.avg_stats.history[0]['valid_accuracy'], float(correct) / 23)
    ft.test_close(float(stats.tot_loss), float(loss_sum), eps=1e-5)
    ft.test_eq(stats.tot_loss.dtype, torch.float32)


def test_avg_stats_metrics_without_batch_sum_and_float64():
    """A metric without batch_sum is summed as its mean times the batch size; a float64 model is
    summed in float64."""

    # differentiable: summed without a graph all the same
    def mean_abs(pred, yb):
        return pred.abs().mean()

    data = make_data()
    learn = make_learner(data, metrics=[mean_abs, accuracy])
    learn.model.double()
    data.train_dl.ds.x, data.valid_dl.ds.x = (
        data.train_dl.ds.x.double(),
        data.valid_dl.ds.x.double(),
    )
    run = Runner()
    run.fit(1, learn)
    stats = run.avg_stats.valid_stats
    assert not stats.tot_loss.requires_grad and not stats.tot_mets[0].requires_grad
    ft.test_eq(stats.tot_loss.dtype, torch.float64)
    with torch.no_grad():
        pred = learn.model(data.valid_ds.x)
    # two equal batches of 4 and 2: weighted
    ft.test_close(stats.avg_stats[1], float(pred.abs().mean()), eps=1e-6)
    ft.test_eq(run.avg_stats.history[0]['train_mean_abs'], run.avg_stats.train_stats.avg_stats[1])


def test_avg_stats_checks_the_summed_metric_once_per_epoch():
    """accuracy's checks still run (on each epoch's first batch), and a batch_sum that keeps a
    gradient is refused."""
    calls = []

    def counted(pred, yb):
        calls.append(len(yb))
        return accuracy(pred, yb)

    counted.batch_sum = accuracy.batch_sum
    Runner(cbs=[AvgStatsCallback([counted], print_stats=False)]).fit(2, make_learner())
    # the full metric once per epoch and phase (training, validation), batch_sum for the rest
    ft.test_eq(len(calls), 4)
    data = make_data()
    # labels that accuracy refuses (the loss takes them)
    data.valid_dl.ds.y = data.valid_dl.ds.y.float()
    learn = make_learner(data, loss_func=lambda pred, yb: F.cross_entropy(pred, yb.long()))
    with pytest.raises(TypeError, match='targ must hold integer class indices'):
        Runner(cbs=[AvgStatsCallback([accuracy], print_stats=False)]).fit(1, learn)

    def total(pred, yb):
        return pred.sum()

    total.batch_sum = lambda pred, yb: pred.sum() * len(yb)
    with pytest.raises(TypeError, match='total.batch_sum must return a tensor without gradient'):
        Runner(cbs=[AvgStatsCallback([total], print_stats=False)]).fit(1, make_learner())


# ---------------- the Runner is the hand-written loop


def test_runner_same_weights_as_hand_written_loop():
    set_seed(0)
    x, y = torch.randn(300, 20), torch.randint(0, 4, (300,))
    train_ds, valid_ds = Dataset(x[:200], y[:200]), Dataset(x[200:], y[200:])
    models = []
    for _ in range(2):
        set_seed(5)
        models.append(nn.Sequential(nn.Linear(20, 10), nn.ReLU(), nn.Linear(10, 4)))
    data = DataBunch(
        DataLoader(train_ds, Sampler(train_ds, 32, shuffle=True, seed=2)),
        DataLoader(valid_ds, Sampler(valid_ds, 64)),
        c=4,
    )
    Runner().fit(3, Learner(data, models[0], F.cross_entropy, SGD, lr=0.3, metrics=[accuracy]))
    opt = SGD(models[1].parameters(), lr=0.3)
    replay = Sampler(train_ds, 32, shuffle=True, seed=2)
    for _ in range(3):
        for idxs in replay:
            F.cross_entropy(models[1](x[idxs]), y[idxs]).backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(*(m.parameters() for m in models)):
        ft.test_eq(p.detach(), q.detach())


def test_start_epoch_resumes_the_counters():
    progress = []

    class Watch(Callback):
        _order = 1

        def begin_epoch(self):
            progress.append(('epoch', self.epoch, self.n_epochs, self.n_iter))

        def after_batch(self):
            if self.in_train:
                progress.append(('batch', self.n_epochs, self.n_iter))

    run = Runner(cbs=[Watch()])
    run.fit(3, make_learner(), start_epoch=2)  # 2 training batches per epoch
    ft.test_eq(progress, [('epoch', 2, 2.0, 4), ('batch', 2.5, 5), ('batch', 3.0, 6)])
    with pytest.raises(ValueError, match=r'start_epoch must be an int in \[0, epochs=3\], got 4'):
        run.fit(3, make_learner(), start_epoch=4)


# ---------------- order as relations, and the table of events


class First(Callback):
    pass


class Second(Callback):
    run_after = (First,)


class Early(Callback):
    run_before = (Second,)


def names(cbs):
    return [type(cb).__name__ for cb in cbs]


def test_sort_callbacks_follows_order_then_relations_stably():
    a, b = TrainEvalCallback(), AvgStatsCallback()
    ft.test_eq(
        names(sort_callbacks([Second(), b, First(), a])),
        ['TrainEvalCallback', 'AvgStatsCallback', 'First', 'Second'],
    )
    # unrelated keep their places
    ft.test_eq(names(sort_callbacks([Second(), Early(), First()])), ['Early', 'First', 'Second'])

    # a subclass counts: Second runs after it too, whatever the numbers say
    class Late(First):
        _order = 5

    ft.test_eq(names(sort_callbacks([Second(), Late()])), ['Late', 'Second'])
    # no relation: as given
    ft.test_eq(names(sort_callbacks([First(), Early(), b])), ['First', 'Early', 'AvgStatsCallback'])


def test_a_cycle_is_an_error_naming_the_callbacks():
    class A(Callback):
        pass

    class B(Callback):
        run_after = (A,)

    class C(Callback):
        run_after = (B,)

    A.run_after = (C,)
    with pytest.raises(ValueError, match='form a cycle: A runs after C runs after B runs after A'):
        sort_callbacks([TrainEvalCallback(), A(), B(), C()])
    with pytest.raises(ValueError, match='form a cycle'):
        Runner(cbs=[A(), B(), C()]).fit(1, make_learner())


def test_relations_must_be_callback_classes():
    class Bad(Callback):
        run_after = AvgStatsCallback  # not a tuple

    class Worse(Callback):
        run_before = ('AvgStatsCallback',)

    with pytest.raises(TypeError, match=r'Bad.run_after must be a tuple of Callback classes'):
        Runner(cbs=[Bad()])
    with pytest.raises(TypeError, match=r'Worse.run_before must be a tuple of Callback classes'):
        Runner(cbs=[Worse()])


def test_relations_order_every_event_and_after_fit_runs_backwards():
    calls = []

    class Log(Callback):
        def begin_fit(self):
            calls.append(('begin_fit', type(self).__name__))

        def after_epoch(self):
            calls.append(('after_epoch', type(self).__name__))

        def after_fit(self):
            calls.append(('after_fit', type(self).__name__))

    class Reader(Log):
        run_after = (AvgStatsCallback,)

    class Stats(Log, AvgStatsCallback):
        pass

    Runner(cbs=[Reader(), Stats([accuracy], print_stats=False)]).fit(1, make_learner())
    ft.test_eq(
        calls,
        [
            ('begin_fit', 'Stats'),
            ('begin_fit', 'Reader'),
            ('after_epoch', 'Stats'),
            ('after_epoch', 'Reader'),
            ('after_fit', 'Reader'),
            ('after_fit', 'Stats'),
        ],
    )


def test_show_events(capsys):
    run = Runner(cbs=[EventLog()])
    # with the learner: its metrics' AvgStatsCallback too
    run.show_events(make_learner(metrics=[accuracy]))
    lines = capsys.readouterr().out.splitlines()
    ft.test_eq([line.split()[0] for line in lines], list(EVENTS))
    ft.test_eq(lines[0][20:], 'TrainEvalCallback, EventLog, AvgStatsCallback')
    ft.test_eq(lines[EVENTS.index('after_fit')][20:], 'EventLog')
    ft.test_eq(lines[EVENTS.index('after_pred')][20:], 'EventLog')
    ft.test_eq(len(run.cbs), 2)  # showing adds nothing
    Runner().show_events()
    ft.test_eq(capsys.readouterr().out.splitlines()[EVENTS.index('after_loss')][20:], '-')


def test_find():
    stats = AvgStatsCallback()
    run = Runner(cbs=[EventLog(), stats, AvgStatsCallback()])
    assert run.find(AvgStatsCallback) is stats and run.find(TrainEvalCallback) is run.cbs[0]
    assert run.find(type('Other', (Callback,), {})) is None
    learn = make_learner(cbs=[stats])
    assert learn.find(AvgStatsCallback) is stats and learn.find(TrainEvalCallback) is None


# ---------------- the logger


def test_avg_stats_hands_the_table_to_the_logger(capsys):
    rows = []
    run = Runner()
    run.logger = rows.append
    run.fit(2, make_learner(metrics=[accuracy]))
    ft.test_eq(rows[0], run.avg_stats.names)
    ft.test_eq(rows[1:], run.avg_stats.history)
    ft.test_eq(capsys.readouterr().out, '')


def test_the_default_logger_prints_the_table(capsys):
    print_row(['epoch', 'train_loss', 'time'])
    print_row({'epoch': 3, 'train_loss': 0.25, 'time': 0.0537})
    ft.test_eq(
        capsys.readouterr().out.splitlines(),
        [f"{'epoch':>16}{'train_loss':>16}{'time':>16}", f"{3:>16}{'0.2500':>16}{'0.05s':>16}"],
    )


def test_a_callback_sets_the_logger_for_one_fit():
    seen = []

    class Quiet(Callback):
        run_before = (AvgStatsCallback,)

        def begin_fit(self):
            self.run.logger = seen.append

    run = Runner(cbs=[Quiet()])
    run.logger = print
    run.fit(1, make_learner(metrics=[accuracy]))
    ft.test_eq(len(seen), 2)
    ft.test_eq(run.logger, print)  # put back when the fit ends
    run = Runner(cbs=[Quiet(), EventLog({'after_epoch': Boom})])
    with pytest.raises(Boom):
        run.fit(1, make_learner(metrics=[accuracy]))
    ft.test_eq(run.logger, print_row)  # also after an error


# ---------------- what callbacks remember


def test_callback_states_by_name():
    class Counter(Callback):
        def __init__(self, n=0):
            self.n = n

        def state_dict(self):
            return {'n': self.n}

        def load_state_dict(self, state):
            self.n = state['n']

    cbs = [Counter(1), TrainEvalCallback(), Counter(2)]
    states = callback_states(cbs)
    # TrainEvalCallback keeps nothing
    ft.test_eq(states, {'counter': {'n': 1}, 'counter_2': {'n': 2}})
    fresh = [Counter(), Counter()]
    # states no callback here claims are left alone
    load_callback_states(fresh, {**states, 'unknown': {'x': 1}})
    ft.test_eq([cb.n for cb in fresh], [1, 2])
    with pytest.raises(ValueError, match='TrainEvalCallback keeps no checkpoint state'):
        TrainEvalCallback().load_state_dict({'n': 1})
    with pytest.raises(TypeError, match='states must be a dict'):
        load_callback_states(fresh, [1])


def test_avg_stats_state_round_trip_and_checks():
    run = Runner()
    run.fit(2, make_learner(metrics=[accuracy]))
    again = AvgStatsCallback([accuracy])
    again.load_state_dict(run.avg_stats.state_dict())
    ft.test_eq(again.history, run.avg_stats.history)
    with pytest.raises(ValueError, match=r"columns \['epoch', 'train_loss', 'train_accuracy'"):
        AvgStatsCallback().load_state_dict(run.avg_stats.state_dict())
    with pytest.raises(ValueError, match="holds 'history'"):
        again.load_state_dict({'history': 3})


def test_fit_with_cb_states_resumes_them_after_begin_fit(capsys):
    first = Runner()
    first.fit(2, make_learner(metrics=[accuracy]))
    rows = []
    run = Runner()
    run.logger = rows.append
    run.fit(
        3, make_learner(metrics=[accuracy]), start_epoch=2, cb_states=callback_states(first.cbs)
    )
    # the first two from the states
    ft.test_eq([row['epoch'] for row in run.avg_stats.history], [0, 1, 2])
    # logged with the new row, so the table shows the whole run
    ft.test_eq(rows[1:3], first.avg_stats.history)
    with pytest.raises(TypeError, match='cb_states must be a dict'):
        run.fit(1, make_learner(), cb_states=[])


# ---------------- torch's DataLoader


def test_databunch_with_torchs_dataloaders():
    from torch.utils.data import DataLoader as TorchDataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 5, generator=g), torch.randint(0, 3, (40,), generator=g)
    train_ds, valid_ds = TensorDataset(x[:30], y[:30]), TensorDataset(x[30:], y[30:])
    data = DataBunch(
        TorchDataLoader(train_ds, batch_size=8, shuffle=True),
        TorchDataLoader(valid_ds, batch_size=4),
        c=3,
    )
    assert data.train_ds is train_ds and data.valid_ds is valid_ds
    learn = make_learner(data, metrics=[accuracy])
    run = Runner()
    run.fit(2, learn)
    ft.test_eq(
        (run.n_iter, run.avg_stats.train_stats.count, run.avg_stats.valid_stats.count),
        (2 * 4, 30, 10),
    )
    # torch's shuffling draws from the global RNG
    ft.test_eq(data.state_dict(), {'samplers': [None, None]})
    with pytest.raises(AttributeError, match=r'train_dl \(list\) has neither .ds nor .dataset'):
        DataBunch([], []).train_ds


# ---------------- teardown and states, under faults


class Teardown(Callback):
    "Logs `label` at after_fit into `log`, then raises `exc` there if given."

    def __init__(self, label, log, exc=None):
        self.label, self.log, self.exc = label, log, exc

    def after_fit(self):
        self.log.append(self.label)
        if self.exc:
            raise self.exc


def test_every_after_fit_runs_and_the_first_error_propagates():
    log = []
    first, second = RuntimeError('first to fail'), ValueError('second to fail')
    cbs = [
        Teardown('a', log),
        Teardown('b', log, second),
        Teardown('c', log, first),
        Teardown('d', log),
    ]
    with pytest.raises(RuntimeError) as info:
        Runner(cbs=cbs).fit(1, make_learner())
    ft.test_eq(log, ['d', 'c', 'b', 'a'])  # reversed, and all four though two raised
    assert info.value is first
    assert any(
        'then Teardown.after_fit raised ValueError: second to fail' in n
        for n in info.value.__notes__
    )


def test_the_fits_own_error_goes_on_with_the_teardowns_as_notes():
    log = []
    with pytest.raises(KeyError) as info:
        Runner(
            cbs=[
                EventLog({'begin_epoch': lambda: KeyError('the fit failed')}),
                Teardown('t', log, RuntimeError('and this')),
            ]
        ).fit(1, make_learner())
    ft.test_eq(log, ['t'])
    ft.test_eq(info.value.__notes__, ['then Teardown.after_fit raised RuntimeError: and this'])


def test_callback_states_load_all_or_nothing():
    stats, other = AvgStatsCallback([accuracy]), AvgStatsCallback()
    good = {'history': [dict(zip(stats.names, [0, 1.0, 0.5, 1.0, 0.5, 0.1]))]}
    with pytest.raises(ValueError, match="this AvgStatsCallback's are"):
        load_callback_states([stats, other], {'avg_stats': good, 'avg_stats_2': good})
    ft.test_eq(stats.history, [])  # the first fitted, and was not loaded either
    load_callback_states([stats], {'avg_stats': good})
    ft.test_eq(stats.history, good['history'])


def test_databunch_states_load_all_or_nothing():
    data = make_data()
    for dl in (data.train_dl, data.valid_dl):
        dl.sampler.shuffle = True
    before = data.state_dict()
    with pytest.raises(ValueError, match="a sampler's state does not fit its generator"):
        data.load_state_dict(
            {
                'samplers': [
                    torch.zeros(5056, dtype=torch.uint8).fill_(7),
                    torch.zeros(3, dtype=torch.uint8),
                ]
            }
        )
    # the first was not set either
    for s, t in zip(data.state_dict()['samplers'], before['samplers']):
        ft.test_eq(s, t)


# ---------------- handlers the runner would silently skip, and losses it cannot average


def test_fastai_v1_event_names_are_refused_with_ours():
    class V1(Callback):
        def on_batch_end(self):
            pass

    ft.test_fail(lambda: Runner(cbs=[V1()]), contains="did you mean 'after_batch'?")
    cb = Callback()
    cb.on_epoch_end = lambda: None  # on the instance: checked too
    ft.test_fail(lambda: Runner(cbs=[cb]), contains="Callback.on_epoch_end looks like an event")


def test_a_handler_set_on_a_callback_instance_runs():
    seen = []
    cb = Callback()
    cb.begin_batch = lambda: seen.append('batch')
    cb.after_fit = lambda: seen.append('fit')
    learn = make_learner(make_data(n_train=8, n_valid=4, bs=4))
    Runner(cbs=[cb]).fit(1, learn)
    ft.test_eq(seen, ['batch'] * 3 + ['fit'])  # 2 training batches, 1 validation batch


def test_a_loss_that_is_not_one_number_is_refused():
    "reduction='none' would fail in backward with torch's words, and average wrongly in validation."
    learn = make_learner(loss_func=lambda p, y: F.cross_entropy(p, y, reduction='none'))
    ft.test_fail(
        lambda: Runner().fit(1, learn),
        contains="the loss function must return one number (a 0-d tensor), got shape (4,)",
    )


def test_a_process_that_does_not_print_logs_nothing_and_shows_no_bars(capsys):
    "run.prints follows the learner's rank: rank 1 logs no row and draws no bar; rank 0 does both."
    from exp.progress import ProgressCallback

    for rank, prints in ((0, True), (1, False)):
        learn = make_learner(metrics=[accuracy])
        learn.rank = rank
        run = Runner(cbs=[ProgressCallback('text')])
        run.fit(2, learn)
        ft.test_eq(run.prints, prints)
        ft.test_eq(run.progress.mode, 'text' if prints else 'off')
        out = capsys.readouterr().out
        ft.test_eq(out.count('\n'), 3 if prints else 0)  # the header and two rows, or nothing
        rows = []
        run = Runner()
        run.logger = rows.append
        run.fit(1, learn)
        ft.test_eq(len(rows), 2 if prints else 0)


def test_probe_is_said_by_a_callback_and_read_from_the_runner():
    "run.probe is true in a fit with the LR finder (or any callback with probe = True), else false."
    from exp.early_stopping import LRFinder

    ft.test_eq(Runner().probe, False)
    ft.test_eq(Runner(cbs=[LRFinder(max_iter=3)]).probe, True)

    class Probing(Callback):  # not `Probe`: its name, probe, is the runner's attribute
        probe = True

    ft.test_eq(Runner(cbs=[Probing()]).probe, True)


def test_avg_stats_reduce_passes_its_sums_and_count_through_a_function():
    "AvgStats.reduce(fn) replaces the sums and the count by fn of them (float64: loss, metrics, n)."
    learn = make_learner(metrics=[accuracy])
    run = Runner()
    run.fit(1, learn)
    stats = run.avg_stats.valid_stats
    sums, count, avgs = [float(s) for s in stats.all_stats], stats.count, stats.avg_stats
    seen = []
    stats.reduce(lambda t: (seen.append(t.clone()), t * 3)[1])
    ft.test_eq(seen[0].dtype, torch.float64)
    ft.test_close(seen[0], torch.tensor([*sums, count], dtype=torch.float64))
    ft.test_eq(stats.count, 3 * count)
    ft.test_close(stats.avg_stats, avgs, eps=1e-6)


def test_pct_train_is_the_fraction_of_training_done():
    "run.pct_train = n_epochs / epochs: 0 at the start, 1 at the end, by training batch in between."
    seen = []

    class Watch(Callback):
        def after_batch(self):
            if self.in_train:
                seen.append((self.run.pct_train, self.n_epochs / self.epochs))

    run = Runner(cbs=[Watch()])
    ft.test_eq(run.pct_train, 0.0)
    run.fit(2, make_learner())
    ft.test_eq([p for p, _ in seen], [q for _, q in seen])
    ft.test_close(seen[-1][0], 1.0)
    ft.test_close(seen[0][0], 1 / (2 * len(run.data.train_dl)))

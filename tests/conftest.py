import errno
import os
import socket

import pytest


def pytest_addoption(parser):
    parser.addoption(
        '--slow',
        action='store_true',
        default=False,
        help='also run notebook cells flagged `#| slow` and tests marked slow (CI does)',
    )


def pytest_configure(config):
    if os.environ.get('PYTEST_XDIST_WORKER'):
        # one of several test processes (pytest -n): one torch thread in it and in every process it
        # starts (notebooks, trainers), so that the workers share the cores instead of fighting over
        # them (on 2 cores, 08b runs 1.2x faster with two threads than with one, but keeps both
        # cores busy). No notebook may depend on the thread count.
        os.environ['OMP_NUM_THREADS'] = os.environ['MKL_NUM_THREADS'] = '1'
        import torch

        torch.set_num_threads(1)
    config.addinivalue_line('markers', 'slow: needs a full data set; runs with --slow')


def _notebook_name(item) -> str:
    "The name of the notebook a test runs, or '' for a test that runs none."
    notebook = getattr(item, 'callspec', None) and item.callspec.params.get('notebook')
    return notebook.stem if notebook is not None else ''


def pytest_collection_modifyitems(config, items):
    # test_notebooks.py reports skipped notebook cells as skipped items; where no cell was skipped,
    # its parameter set is empty, which is nothing to report: drop that placeholder item
    empty = [
        item
        for item in items
        if item.originalname == 'test_flagged_cells'
        and not isinstance(item.callspec.params['skipped_cells'], tuple)
    ]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [item for item in items if item not in empty]
    # the notebooks' runs first, the later (longer) notebooks first: with several workers (pytest
    # -n) the short tests then fill in around them, instead of one long notebook running alone at
    # the end (a reverse sort keeps equal keys in their collected order, and puts the other tests,
    # named '', last)
    items.sort(key=_notebook_name, reverse=True)
    if config.getoption('--slow'):
        return
    skip = pytest.mark.skip(reason='slow: pass --slow to run')
    for item in items:
        if 'slow' in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    "An empty data cache folder, set as $EXP_DATA for the test."
    folder = tmp_path / 'cache'
    monkeypatch.setenv('EXP_DATA', str(folder))
    return folder


@pytest.fixture
def no_network(monkeypatch):
    "Every name lookup and every connection fails, as on a machine without a network."

    def refuse(*args, **kwargs):
        raise OSError(errno.ENETUNREACH, 'Network is unreachable (cut by the test)')

    monkeypatch.setattr(socket, 'getaddrinfo', refuse)
    monkeypatch.setattr(socket.socket, 'connect', refuse)

import errno
import socket

import pytest


def pytest_addoption(parser):
    parser.addoption('--slow', action='store_true', default=False,
                     help='also run notebook cells flagged `#| slow` and tests marked slow (CI does)')


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: needs a full data set; runs with --slow')


def pytest_collection_modifyitems(config, items):
    # test_notebooks.py reports skipped notebook cells as skipped items; where no cell was skipped,
    # its parameter set is empty, which is nothing to report: drop that placeholder item
    empty = [item for item in items if item.originalname == 'test_flagged_cells'
             and not isinstance(item.callspec.params['skipped_cells'], tuple)]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [item for item in items if item not in empty]
    if config.getoption('--slow'): return
    skip = pytest.mark.skip(reason='slow: pass --slow to run')
    for item in items:
        if 'slow' in item.keywords: item.add_marker(skip)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    "An empty data cache folder, set as $EXP_DATA for the test."
    folder = tmp_path / 'cache'
    monkeypatch.setenv('EXP_DATA', str(folder))
    return folder


@pytest.fixture
def no_network(monkeypatch):
    "Every name lookup and every connection fails, as on a machine without a network."
    def refuse(*args, **kwargs): raise OSError(errno.ENETUNREACH, 'Network is unreachable (cut by the test)')
    monkeypatch.setattr(socket, 'getaddrinfo', refuse)
    monkeypatch.setattr(socket.socket, 'connect', refuse)

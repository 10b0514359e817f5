"""Unit tests for exp.terminal: which display a fit gets, the bars for it, and the batch of
fastprogress's next redraw."""

import io
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from fastprogress.fastprogress import (
    ConsoleMasterBar,
    ConsoleProgressBar,
    NBMasterBar,
    NBProgressBar,
)

import exp.terminal
from exp.terminal import (
    DISPLAYS,
    batches_bar,
    close_bar,
    epochs_bar,
    is_terminal,
    progress_display,
    update_bar,
)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_auto_picks_by_where_output_goes(monkeypatch):
    ft.test_eq(progress_display('auto'), 'text')  # pytest's captured stdout is no terminal
    monkeypatch.setattr(sys, 'stdout', Terminal())
    ft.test_eq(progress_display('auto'), 'console')
    monkeypatch.setattr(exp.terminal, 'in_jupyter', lambda: True)
    ft.test_eq(progress_display('auto'), 'notebook')
    ft.test_eq(progress_display('text'), 'text')
    monkeypatch.setattr(sys, 'stdout', object())  # no isatty at all
    monkeypatch.setattr(exp.terminal, 'in_jupyter', lambda: False)
    ft.test_eq(progress_display('auto'), 'text')


def test_not_in_jupyter_here():
    assert not exp.terminal.in_jupyter()


def test_is_terminal_calls_isatty():
    class NotATerminal(io.StringIO):
        def isatty(self):
            return False

    ft.test_eq(
        [is_terminal(s) for s in (Terminal(), NotATerminal(), io.StringIO(), object())],
        [True, False, False, False],
    )


def test_forced_displays_and_checks():
    ft.test_eq([progress_display(d) for d in DISPLAYS[1:]], list(DISPLAYS[1:]))
    with pytest.raises(ValueError, match="got 'tty'"):
        progress_display('tty')
    with pytest.raises(ValueError, match="mode must be one of notebook, console, text, off; got"):
        epochs_bar('auto', 2)
    with pytest.raises(ValueError, match="n must be a number of batches, at least 0; got -1"):
        batches_bar(None, -1)


def test_bars_of_each_kind(capsys):
    assert epochs_bar('text', 3) is None and epochs_bar('off', 3) is None
    assert epochs_bar('console', 0) is None
    mbar = epochs_bar('console', 2)
    assert isinstance(mbar, ConsoleMasterBar)
    pbar = batches_bar(mbar, 5)
    assert isinstance(pbar, ConsoleProgressBar) and pbar.parent is mbar and pbar.last_v == 0
    assert batches_bar(mbar, 0) is None and batches_bar(None, 5) is None
    close_bar(pbar)  # cut short: ended, and its line blanked
    assert capsys.readouterr().out.endswith('\r' + ' ' * pbar.max_len + '\r')
    close_bar(None)
    ft.test_eq(capsys.readouterr().out, '')
    mbar.on_iter_end()


def test_notebook_bars_in_an_ipython_shell():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    try:
        with capture_output():
            mbar = epochs_bar('notebook', 1)
            pbar = batches_bar(mbar, 3)
            assert isinstance(mbar, NBMasterBar) and isinstance(pbar, NBProgressBar)
            for n in range(1, 4):
                update_bar(pbar, n)
            close_bar(pbar)
            mbar.on_iter_end()
    finally:
        InteractiveShell.clear_instance()


def test_update_bar_returns_the_next_redraw():
    pbar = ConsoleProgressBar(range(1000), display=False)
    pbar.update(0)
    # the first few batches are each drawn
    ft.test_eq([update_bar(pbar, n) for n in range(1, pbar.first_its)], list(range(2, 6)))
    due = update_bar(pbar, pbar.first_its)
    ft.test_eq(due, min(pbar.last_v + pbar.wait_for, pbar.total))
    assert due > pbar.first_its
    ft.test_eq(update_bar(pbar, 1000), math.inf)  # the end


def test_terminal_does_not_import_progress():
    "exp.progress imports exp.terminal, never the other way round."
    code = "import sys, exp.terminal; assert 'exp.progress' not in sys.modules, sorted(sys.modules)"
    root = str(Path(__file__).resolve().parents[1])  # this checkout's exp, not an installed one
    subprocess.run([sys.executable, '-c', code], check=True, env={**os.environ, 'PYTHONPATH': root})

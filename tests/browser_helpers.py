"""A real Chromium with the LocalKB extension, a real host, and pages served on 127.0.0.1.

Used by ``test_browser.py``::

    with sync_playwright() as pw, PageServer({"/a.html": ("text/html", b"<html>...")}) as pages, \\
            ExtensionBrowser(pw, extension_copy(tmp_path / "ext"), tmp_path / "profile") as browser:
        job = browser.worker_eval("localkb.save({...})")

One Playwright per thread: its sync API refuses a second one while the first runs, so
several browsers share it.

The extension is loaded from a copy in tmp (``extension_copy``) whose manifest adds
``host_permissions`` for ``http://127.0.0.1/*``. That stands in for the user granting
access: a scripted call has no user gesture, so it gets no ``activeTab`` grant and
``chrome.permissions.request`` cannot prompt; without the grant a save fails honestly with
``no_access`` (which a test checks on an origin the grant leaves out).

Chromium reads per-user native-messaging manifests from
``<user-data-dir>/NativeMessagingHosts/``; ``register_host`` writes one there that points
at the launcher ``localkb install`` would write, running this interpreter's
``-m localkb host`` against the test's data directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sqlite3
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXTENSION_DIR = REPO / "extension"
HOST_NAME = "com.localkb.host"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# A hang guard for waits in the page, never a pass/fail criterion on speed.
WAIT_MS = 90_000

CHROMIUM_ARGS = (
    "--no-sandbox",  # CI containers run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # small /dev/shm in containers crashes renderers
)


def chromium_path() -> str | None:
    """The Chromium executable to drive, or None when none is installed."""
    for candidate in (os.environ.get("LOCALKB_CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def extension_id(manifest: Mapping[str, Any]) -> str:
    """Chrome's id for an extension with this manifest ``key``: sha256 of the key, a-p coded."""
    digest = hashlib.sha256(base64.b64decode(manifest["key"])).hexdigest()[:32]
    return "".join(chr(ord("a") + int(c, 16)) for c in digest)


def extension_copy(dest: Path, *, host_permissions: list[str] | None = None) -> Path:
    """Copy ``extension/`` (without its node tests) to ``dest``, optionally granting hosts."""
    shutil.copytree(EXTENSION_DIR, dest, ignore=shutil.ignore_patterns("test", "node_modules"))
    if host_permissions is not None:
        manifest_path = dest / "manifest.json"
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        manifest["host_permissions"] = host_permissions
        manifest_path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return dest


def write_launcher(path: Path, home: Path) -> Path:
    """The launcher ``localkb install`` writes (same text), running the real host on ``home``.

    It hands on what Chromium passes (the caller's origin), so the host's argument handling
    is exercised exactly as after a real install.
    """
    from localkb.native.install import launcher_script

    path.write_text(launcher_script([sys.executable, "-m", "localkb", "host"], home), encoding="utf-8")
    path.chmod(0o755)
    return path


def register_host(user_data_dir: Path, launcher: Path, ext_id: str) -> Path:
    """Write the per-user native-messaging manifest Chromium reads for this profile."""
    folder = user_data_dir / "NativeMessagingHosts"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": HOST_NAME,
        "description": "LocalKB host (browser test)",
        "path": str(launcher),
        "type": "stdio",
        "allowed_origins": [f"chrome-extension://{ext_id}/"],
    }
    target = folder / f"{HOST_NAME}.json"
    target.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return target


class ExtensionBrowser:
    """Headless Chromium (persistent profile) with an extension loaded; a context manager."""

    def __init__(self, pw, extension: Path, user_data_dir: Path, *, downloads: Path | None = None,
                 env: Mapping[str, str] | None = None, color_scheme: str | None = None) -> None:
        self._pw = pw
        self.env = {**os.environ, **env} if env else None  # the host inherits Chromium's environment
        self.color_scheme = color_scheme
        self.extension = extension
        self.user_data_dir = user_data_dir
        self.downloads = downloads
        manifest = json.loads((extension / "manifest.json").read_text(encoding="utf-8"))
        self.ext_id = extension_id(manifest)
        self.context = None
        self.worker = None

    def __enter__(self) -> ExtensionBrowser:
        executable = chromium_path()
        if executable is None:
            raise RuntimeError("no Chromium installed")
        try:
            self.context = self._pw.chromium.launch_persistent_context(
                str(self.user_data_dir),
                headless=True,
                executable_path=executable,
                accept_downloads=True,
                downloads_path=str(self.downloads) if self.downloads else None,
                viewport={"width": 420, "height": 860},
                env=self.env,
                color_scheme=self.color_scheme,
                args=[f"--load-extension={self.extension}",
                      f"--disable-extensions-except={self.extension}", *CHROMIUM_ARGS],
            )
            self.context.set_default_timeout(WAIT_MS)
            workers = [w for w in self.context.service_workers if self.ext_id in w.url]
            self.worker = workers[0] if workers else self.context.wait_for_event(
                "serviceworker", predicate=lambda w: self.ext_id in w.url, timeout=WAIT_MS)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the browser, which closes the native ports, so the hosts exit."""
        if self.context is not None:
            self.context.close()
            self.context = None

    def url(self, page: str) -> str:
        """The extension URL of one of its pages."""
        return f"chrome-extension://{self.ext_id}/{page}"

    def worker_eval(self, expression: str, arg: Any = None) -> Any:
        """Evaluate in the service worker (awaited when it returns a promise)."""
        return self.worker.evaluate(expression, arg)

    def open(self, page: str, *, width: int | None = None, height: int = 900):
        """Open one of the extension's pages in a new tab and return it.

        Pages open at the side panel's width (the context's viewport) unless ``width``
        says otherwise: the options page opens in a full tab.
        """
        tab = self.context.new_page()
        if width is not None:
            tab.set_viewport_size({"width": width, "height": height})
        tab.goto(self.url(page))
        return tab


class PageServer:
    """A ThreadingHTTPServer on 127.0.0.1 serving fixed bytes per path; a context manager."""

    def __init__(self, routes: Mapping[str, tuple[str, bytes]], *, cookie: str | None = None,
                 members_only: tuple[str, ...] = ()) -> None:
        """``members_only`` paths answer 403 unless the request carries ``cookie`` (a sign-in)."""
        self.routes = dict(routes)
        self.cookie = cookie
        self.members_only = set(members_only)
        self.hits: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PageServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output clean."""

            def do_GET(self) -> None:
                owner.hits.append(self.path)
                path = self.path.split("?", 1)[0]
                route = owner.routes.get(path)
                if path in owner.members_only and owner.cookie not in self.headers.get("Cookie", ""):
                    route = ("text/html", b"<!doctype html><title>Sign in</title><p>Sign in first.</p>")
                    self.send_response(403)
                    self.send_header("Content-Type", route[0])
                    self.end_headers()
                    self.wfile.write(route[1])
                    return
                if route is None:
                    self.send_error(404)
                    return
                content_type, body = route
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, name="pages")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def url(self, path: str) -> str:
        """The full URL of a served path."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"


def catalog_rows(home: Path, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
    """Read the host's catalogue directly (read-only), as a second witness to what was saved."""
    con = sqlite3.connect(f"file:{home / 'catalog.sqlite'}?mode=ro", uri=True)
    try:
        con.row_factory = sqlite3.Row
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def skip_without_a_browser(what: str) -> None:
    """Skip the calling test module, loudly, when Chromium or Playwright is missing."""
    import pytest

    if chromium_path() is None:
        pytest.skip(f"NO CHROMIUM INSTALLED: {what} did NOT run (apt-get install chromium).",
                    allow_module_level=True)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:  # pragma: no cover - the dev extra installs it
        pytest.skip(f"PLAYWRIGHT NOT INSTALLED: {what} did NOT run.", allow_module_level=True)


@contextmanager
def browser_with_host(tmp: Path, home: Path) -> Iterator[ExtensionBrowser]:
    """A Chromium of its own (own Playwright) with the extension and the real host on ``home``,
    the test copy granted ``http://127.0.0.1/*``: a test module's ``browser`` fixture."""
    from playwright.sync_api import sync_playwright

    ext = extension_copy(tmp / "extension", host_permissions=["http://127.0.0.1/*"])
    profile = tmp / "profile"
    launcher = write_launcher(tmp / "localkb-host", home)
    register_host(profile, launcher, extension_id(json.loads((ext / "manifest.json").read_text())))
    with sync_playwright() as pw, ExtensionBrowser(pw, ext, profile) as b:
        yield b


def host_request(browser: ExtensionBrowser, type_: str, data: dict | None = None) -> Any:
    """A request to the real host through the worker's native port."""
    return browser.worker_eval("([t, d]) => localkb.host.request(t, d)", [type_, data or {}])

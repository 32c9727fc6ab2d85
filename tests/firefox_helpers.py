"""A real Firefox (Debian's ``firefox-esr``) with the LocalKB extension, driven over WebDriver BiDi.

Used by ``test_firefox.py``. No driver download and no third-party client: Firefox's own
remote agent speaks WebDriver BiDi on a websocket (``--remote-debugging-port``), and
``BiDi`` below is a small client for it on the standard library. The extension is the
generated Firefox build (``tools/firefox_manifest.py`` writes ``build/firefox/``), copied to
tmp and installed as a temporary add-on with BiDi's ``webExtension.install``.

Firefox reads per-user native-messaging manifests from ``$HOME/.mozilla/native-messaging-hosts``
on Linux, so each browser gets its own temporary ``HOME``, where the tests run the real
``localkb install --browser firefox``.

Extension pages are opened in ordinary tabs at a fixed ``moz-extension://`` origin (the pref
``extensions.webextensions.uuids`` pins the internal UUID). BiDi refuses to navigate a tab to
``moz-extension://`` itself, so the test build makes the pages web-accessible to 127.0.0.1 and
a served blank page steps there; BiDi sends no load event for extension pages either, so
``open`` waits for the tab's committed URL. The background page's entry
points (``localkb.save``, ``localkb.onMenuClick``, ``localkb.host``) are reached through
``runtime.getBackgroundPage()`` from such a tab, the Firefox counterpart of evaluating in
Chromium's service worker.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIREFOX_BUILD = REPO / "build" / "firefox"
FIREFOX_CANDIDATES = ("/usr/bin/firefox-esr", "/usr/lib/firefox-esr/firefox-esr")
GECKO_ID = "localkb@localkb.invalid"
EXTENSION_UUID = "6b1c5f3e-9d3a-4c1e-8f43-10ca1b0c0001"
# A hang guard for waits, never a pass/fail criterion on speed.
WAIT_S = 120.0

PREFS: dict[str, Any] = {
    # A fixed moz-extension:// origin, so tests can open the extension's pages by URL.
    "extensions.webextensions.uuids": json.dumps({GECKO_ID: EXTENSION_UUID}),
    "browser.shell.checkDefaultBrowser": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.aboutwelcome.enabled": False,
    "app.update.disabledForTesting": True,
    "extensions.update.enabled": False,
    "network.proxy.allow_hijacking_localhost": False,
}


def firefox_path() -> str | None:
    """The Firefox executable to drive, or None when none is installed."""
    for candidate in (os.environ.get("LOCALKB_FIREFOX"), *FIREFOX_CANDIDATES, shutil.which("firefox-esr")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def build_firefox_extension(dest: Path, *, host_permissions: list[str] | None = None) -> Path:
    """Write the Firefox build into ``dest`` with the repository's build step; optionally grant hosts."""
    subprocess.run([sys.executable, str(REPO / "tools" / "firefox_manifest.py"), "--out", str(dest)],
                   check=True, capture_output=True)
    path = dest / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if host_permissions is not None:
        manifest["host_permissions"] = host_permissions
    # WebDriver BiDi may not navigate a tab to moz-extension:// itself; a served page may, when
    # the extension's pages are web-accessible to it (test build only).
    manifest["web_accessible_resources"] = [{"resources": ["*.html"], "matches": ["http://127.0.0.1/*"]}]
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    # An extension page that does nothing by itself, from which the tests reach the background
    # page (the real pages ask the host for things on load, which would hide what install did).
    (dest / "test-blank.html").write_text("<!doctype html><meta charset=\"utf-8\"><title>test</title>\n",
                                          encoding="utf-8")
    return dest


# ---------------------------------------------------------------- a websocket, RFC 6455 client side


class WebSocket:
    """A blocking websocket client for text messages: enough for one BiDi session."""

    def __init__(self, url: str, timeout: float = 2 * WAIT_S) -> None:
        rest = url.removeprefix("ws://")
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        status, _, self._buffer = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {status[:200]!r}")
        self._lock = threading.Lock()

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ConnectionError("websocket closed")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        with self._lock:
            self.sock.sendall(header + mask + masked)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode("utf-8"))

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(n)  # servers never mask
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket closed by Firefox")
            if opcode in (0x0, 0x1):
                message += payload
                if b0 & 0x80:
                    return message.decode("utf-8")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send_frame(0x8, b"")
        self.sock.close()


class BiDiError(RuntimeError):
    """An error reply to a BiDi command."""


class BiDi:
    """Commands and events of one WebDriver BiDi session."""

    def __init__(self, url: str) -> None:
        self.ws = WebSocket(url)
        self._next = 0
        self.events: list[dict] = []

    def command(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        self._next += 1
        ident = self._next
        self.ws.send(json.dumps({"id": ident, "method": method, "params": dict(params or {})}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == ident:
                if msg.get("type") == "error":
                    raise BiDiError(f"{method}: {msg.get('error')}: {msg.get('message')}")
                return msg["result"]
            if msg.get("type") == "event":
                self.events.append(msg)

    def close(self) -> None:
        self.ws.close()


class Tab:
    """One browsing context (a tab) and the script evaluated in it."""

    def __init__(self, bidi: BiDi, context: str) -> None:
        self.bidi = bidi
        self.context = context

    def goto(self, url: str) -> None:
        self.bidi.command("browsingContext.navigate",
                          {"context": self.context, "url": url, "wait": "complete"})

    def eval(self, expression: str, arg: Any = None) -> Any:
        """Evaluate ``(expression)(arg)`` (a function, awaited); JSON crosses, so results are plain data."""
        source = (f"(async () => JSON.stringify(await ({expression})({json.dumps(arg)}) ?? null))()")
        result = self.bidi.command("script.evaluate", {
            "expression": source, "target": {"context": self.context}, "awaitPromise": True,
            "resultOwnership": "none"})
        if result.get("type") == "exception":
            details = result["exceptionDetails"]
            raise BiDiError(f"in page: {details.get('text')}")
        return json.loads(result["result"]["value"])  # the page stringified it: JSON crosses

    def wait_for(self, predicate: str, arg: Any = None, timeout: float = WAIT_S) -> Any:
        """Wait, in the page, until ``predicate(arg)`` is truthy; returns that value."""
        return self.eval(f"""(arg) => new Promise((resolve, reject) => {{
            const test = {predicate};
            let over = false;
            const guard = setTimeout(() => {{ over = true;
                reject(new Error('timed out waiting for: ' + {json.dumps(predicate[:300])})); }},
                {int(timeout * 1000)});
            const loop = async () => {{
                if (over) return;
                let value;
                try {{ value = await test(arg); }}
                catch (err) {{ over = true; clearTimeout(guard); reject(err); return; }}
                if (value) {{ over = true; clearTimeout(guard); resolve(value); return; }}
                setTimeout(loop, 20);
            }};
            loop();
        }})""", arg)

    def text(self, selector: str) -> str:
        """The innerText of the first element matching ``selector`` (waits for it)."""
        return self.wait_for("(sel) => { const el = document.querySelector(sel);"
                             " return el ? [el.innerText] : null; }", selector)[0]

    def texts(self, selector: str) -> list[str]:
        """The innerText of every element matching ``selector`` now."""
        return self.eval("(sel) => [...document.querySelectorAll(sel)].map((el) => el.innerText)", selector)

    def click(self, finder: str, arg: Any = None) -> None:
        """Click, with a real mouse, the element ``finder`` finds.

        ``finder`` is a CSS selector, or a JS function ``(arg) => element``. Waits until the
        element exists and is visible, scrolls it into view, then moves, presses and releases.
        """
        find = finder if finder.lstrip().startswith("(") else \
            f"() => document.querySelector({json.dumps(finder)})"
        self.wait_for(f"(arg) => {{ const el = ({find})(arg);"
                      " if (!el || !el.getClientRects().length) return false;"
                      " el.scrollIntoView({block: 'center'}); return true; }", arg)
        found = self.bidi.command("script.callFunction", {
            "functionDeclaration": f"(raw) => ({find})(JSON.parse(raw))",
            "arguments": [{"type": "string", "value": json.dumps(arg)}],
            "target": {"context": self.context}, "awaitPromise": False, "resultOwnership": "root"})
        node = found["result"]
        if node.get("type") != "node":
            raise BiDiError(f"{finder!r} found no element")
        self.bidi.command("input.performActions", {"context": self.context, "actions": [{
            "type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"}, "actions": [
                {"type": "pointerMove", "x": 0, "y": 0,
                 "origin": {"type": "element", "element": {"sharedId": node["sharedId"]}}},
                {"type": "pointerDown", "button": 0}, {"type": "pointerUp", "button": 0}]}]})

    def type(self, text: str) -> None:
        """Type ``text`` with the keyboard into what has focus; a newline presses Enter."""
        keys = []
        for ch in text:
            key = "\ue007" if ch == "\n" else ch
            keys += [{"type": "keyDown", "value": key}, {"type": "keyUp", "value": key}]
        self.bidi.command("input.performActions", {"context": self.context, "actions": [
            {"type": "key", "id": "keyboard", "actions": keys}]})

    def fill(self, selector: str, text: str) -> None:
        """Empty a text field, then click it and type ``text`` (as a user would)."""
        self.eval("(sel) => { const el = document.querySelector(sel); el.value = '';"
                  " el.dispatchEvent(new Event('input', {bubbles: true})); }", selector)
        self.click(selector)
        self.type(text)

    def select(self, selector: str, value: str) -> None:
        """Choose ``value`` in a <select>, firing the change event the page listens for."""
        self.eval("([sel, value]) => { const el = document.querySelector(sel);"
                  " if (![...el.options].some((o) => o.value === value))"
                  " throw new Error('no option ' + value);"
                  " el.value = value; el.dispatchEvent(new Event('input', {bubbles: true}));"
                  " el.dispatchEvent(new Event('change', {bubbles: true})); }", [selector, value])

    def viewport(self, width: int, height: int) -> None:
        self.bidi.command("browsingContext.setViewport",
                          {"context": self.context, "viewport": {"width": width, "height": height}})

    def screenshot(self, path: Path) -> Path:
        data = self.bidi.command("browsingContext.captureScreenshot", {"context": self.context})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self.bidi.command("browsingContext.close", {"context": self.context})


class FirefoxExtension:
    """Headless Firefox with the extension as a temporary add-on; a context manager.

    ``home`` becomes Firefox's ``HOME`` (where it looks for native-messaging manifests);
    ``env`` adds to the environment the host inherits; ``dark`` sets the content colour
    scheme through the profile's prefs.
    """

    def __init__(self, extension: Path, profile: Path, home: Path, *,
                 env: Mapping[str, str] | None = None, dark: bool = False) -> None:
        self.extension = extension
        self.profile = profile
        self.home = home
        self.env = {**os.environ, **(env or {}), "HOME": str(home), "MOZ_CRASHREPORTER_DISABLE": "1"}
        self.dark = dark
        self.proc: subprocess.Popen | None = None
        self.bidi: BiDi | None = None
        self.base = f"moz-extension://{EXTENSION_UUID}/"

    def __enter__(self) -> FirefoxExtension:
        executable = firefox_path()
        if executable is None:
            raise RuntimeError("no Firefox installed")
        self.profile.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        prefs = {**PREFS, "layout.css.prefers-color-scheme.content-override": 0 if self.dark else 1}
        lines = (f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in prefs.items())
        (self.profile / "user.js").write_text("".join(lines), encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                [executable, "--headless", "--no-remote", "--profile", str(self.profile),
                 "--remote-debugging-port", "0", "about:blank"],
                env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            url = self._listening_url()
            self.bidi = BiDi(f"{url}/session")
            self.bidi.command("session.new", {"capabilities": {"alwaysMatch": {
                "unhandledPromptBehavior": {"default": "ignore"}}}})
            self.bidi.command("webExtension.install", {"extensionData": {"type": "path",
                                                                         "path": str(self.extension)}})
            self.trampoline = self._serve_blank()
            self.background_tab = self.open("test-blank.html")
            self.background_tab.wait_for(
                "async () => { const bg = await chrome.runtime.getBackgroundPage(); return !!bg?.localkb; }")
        except BaseException:
            self.close()
            raise
        return self

    def _listening_url(self) -> str:
        """Read Firefox's stderr until its remote agent says where it listens."""
        lines = []
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            lines.append(line)
            if "WebDriver BiDi listening on " in line:
                url = line.split("listening on ", 1)[1].strip()
                # Keep draining stderr so Firefox never blocks on a full pipe.
                threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
                return url
        raise RuntimeError("Firefox exited before its remote agent listened:\n" + "".join(lines[-20:]))

    def _serve_blank(self) -> str:
        """A page on 127.0.0.1 from which tabs step to the extension's pages."""
        from browser_helpers import PageServer

        self._blank = PageServer({"/blank.html": ("text/html", b"<!doctype html><title>blank</title>")})
        self._blank.__enter__()
        return self._blank.url("/blank.html")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the session and Firefox, which closes the native ports, so the hosts exit."""
        if self.bidi is not None:
            with contextlib.suppress(BiDiError, OSError, ConnectionError):
                self.bidi.command("browser.close")
            self.bidi.close()
            self.bidi = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if getattr(self, "_blank", None) is not None:
            self._blank.__exit__()
            self._blank = None

    def url(self, page: str) -> str:
        return self.base + page

    def open(self, url: str, *, width: int = 420, height: int = 860) -> Tab:
        """A new tab at ``url`` (an extension page by name, or a full URL), sized like the sidebar."""
        assert self.bidi is not None
        context = self.bidi.command("browsingContext.create", {"type": "tab"})["context"]
        tab = Tab(self.bidi, context)
        tab.viewport(width, height)
        if "://" in url:
            tab.goto(url)
            return tab
        tab.goto(self.trampoline)
        target = self.url(url)
        tab.eval("(url) => { location.href = url; }", target)
        # BiDi sends no load event for extension pages: wait until the tab's tree shows the
        # committed URL, then for the document itself.
        deadline = time.monotonic() + WAIT_S
        while self.bidi.command("browsingContext.getTree",
                                {"root": context, "maxDepth": 0})["contexts"][0]["url"] != target:
            if time.monotonic() > deadline:
                raise BiDiError(f"the tab never reached {target}")
            time.sleep(0.05)  # the poll interval of this wait, not a wait in itself
        tab.wait_for("() => document.readyState === 'complete'")
        return tab

    def background(self, expression: str, arg: Any = None) -> Any:
        """Evaluate ``(expression)(arg)`` with the background page's globals (``localkb``, ``chrome``).

        The function is compiled in an extension tab, whose scope chain is given the
        background window with ``with`` (BiDi evaluates sloppy scripts), since the
        extension's CSP forbids ``eval`` in the background page itself.
        """
        return self.background_tab.eval(
            "async (arg) => { const bg = await chrome.runtime.getBackgroundPage();"
            f" with (bg) {{ return await ({expression})(arg); }} }}", arg)


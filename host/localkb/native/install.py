"""Register the native-messaging host with browsers (per user, Linux and macOS).

``install`` writes one launcher script and, for each browser, the host manifest
``com.localkb.host.json`` built from the templates in ``manifest/``; ``uninstall``
removes them; ``check`` reports what is registered where and whether the launcher
answers a real framed ``status`` request.

The launcher (``<per-user data dir>/localkb-host``) runs *this* installation's
Python with ``-m localkb host``. ``sys.executable`` is used as given, never resolved,
so a virtualenv's interpreter keeps its site-packages. Browsers start hosts with
their own environment, not the shell's, so a ``LOCALKB_HOME`` in effect at install
time is written into the launcher.

Manifest directories (per user; file ``com.localkb.host.json``)::

    chrome    Linux ~/.config/google-chrome/NativeMessagingHosts
              macOS ~/Library/Application Support/Google/Chrome/NativeMessagingHosts
    chromium  Linux ~/.config/chromium/NativeMessagingHosts
              macOS ~/Library/Application Support/Chromium/NativeMessagingHosts
    brave     Linux ~/.config/BraveSoftware/Brave-Browser/NativeMessagingHosts
              macOS ~/Library/Application Support/BraveSoftware/Brave-Browser/NativeMessagingHosts
    edge      Linux ~/.config/microsoft-edge/NativeMessagingHosts
              macOS ~/Library/Application Support/Microsoft Edge/NativeMessagingHosts
    firefox   Linux ~/.mozilla/native-messaging-hosts
              macOS ~/Library/Application Support/Mozilla/NativeMessagingHosts

The templates and the extension's public key are read from the source tree
(``manifest/`` and ``extension/manifest.json`` beside ``host/``), which is where an
editable install keeps them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localkb.errors import InvalidInput, NotFound
from localkb.native import protocol
from localkb.perms import private_dir

HOST_NAME = "com.localkb.host"
MANIFEST_FILE = f"{HOST_NAME}.json"
LAUNCHER_NAME = "localkb-host"
BROWSERS = ("chrome", "chromium", "brave", "edge", "firefox")
CHECK_TIMEOUT = 20.0

_REPO = Path(__file__).resolve().parents[3]
TEMPLATE_DIR = _REPO / "manifest"
EXTENSION_MANIFEST = _REPO / "extension" / "manifest.json"

_MAC_SUPPORT = ("Library", "Application Support")

# browser -> platform -> (manifest directory, directories whose existence means
# "this browser is used here"), all relative to the home directory.
_LOCATIONS: dict[str, dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]] = {
    "chrome": {
        "linux": (
            (".config", "google-chrome", "NativeMessagingHosts"),
            ((".config", "google-chrome"),),
        ),
        "darwin": (
            (*_MAC_SUPPORT, "Google", "Chrome", "NativeMessagingHosts"),
            ((*_MAC_SUPPORT, "Google", "Chrome"),),
        ),
    },
    "chromium": {
        "linux": ((".config", "chromium", "NativeMessagingHosts"), ((".config", "chromium"),)),
        "darwin": (
            (*_MAC_SUPPORT, "Chromium", "NativeMessagingHosts"),
            ((*_MAC_SUPPORT, "Chromium"),),
        ),
    },
    "brave": {
        "linux": (
            (".config", "BraveSoftware", "Brave-Browser", "NativeMessagingHosts"),
            ((".config", "BraveSoftware", "Brave-Browser"),),
        ),
        "darwin": (
            (*_MAC_SUPPORT, "BraveSoftware", "Brave-Browser", "NativeMessagingHosts"),
            ((*_MAC_SUPPORT, "BraveSoftware", "Brave-Browser"),),
        ),
    },
    "edge": {
        "linux": (
            (".config", "microsoft-edge", "NativeMessagingHosts"),
            ((".config", "microsoft-edge"),),
        ),
        "darwin": (
            (*_MAC_SUPPORT, "Microsoft Edge", "NativeMessagingHosts"),
            ((*_MAC_SUPPORT, "Microsoft Edge"),),
        ),
    },
    "firefox": {
        "linux": ((".mozilla", "native-messaging-hosts"), ((".mozilla",),)),
        # Firefox keeps profiles under "Firefox" but reads hosts from "Mozilla".
        "darwin": (
            (*_MAC_SUPPORT, "Mozilla", "NativeMessagingHosts"),
            ((*_MAC_SUPPORT, "Firefox"), (*_MAC_SUPPORT, "Mozilla")),
        ),
    },
}


@dataclass(frozen=True)
class InstallResult:
    """One manifest written: where, for which browser, pointing at which launcher."""

    browser: str
    manifest: Path
    launcher: Path


@dataclass(frozen=True)
class UninstallResult:
    """One manifest location visited; ``removed`` is False when nothing was there."""

    browser: str
    manifest: Path
    removed: bool


@dataclass(frozen=True)
class CheckResult:
    """What one browser would find: a manifest, a launcher, and whether it answers."""

    browser: str
    manifest: Path
    registered: bool  # our manifest file exists
    valid: bool  # it names our host and allows our extension
    launcher: Path | None
    executable: bool
    answered: bool  # the launcher replied ok to a framed status request
    version: str | None
    problem: str | None  # first thing wrong, in words; None when all is well


# --- ids -------------------------------------------------------------------------


def extension_id_from_key(b64: str) -> str:
    """Chrome's extension id for a manifest ``key``: sha256 of the DER key, 32 hex digits -> a-p."""
    try:
        der = base64.b64decode(b64, validate=True)
    except ValueError as err:
        raise InvalidInput("extension key is not valid base64") from err
    digest = hashlib.sha256(der).hexdigest()[:32]
    return "".join(chr(ord("a") + int(d, 16)) for d in digest)


def extension_ids(extension_manifest: Path = EXTENSION_MANIFEST) -> tuple[str, str]:
    """The (Chromium id, Firefox id) of the LocalKB extension, read from its manifest."""
    try:
        data = json.loads(extension_manifest.read_text(encoding="utf-8"))
        key = data["key"]
        gecko_id = data["browser_specific_settings"]["gecko"]["id"]
    except FileNotFoundError as err:
        raise NotFound(f"extension manifest not found at {extension_manifest}") from err
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InvalidInput(
            f"extension manifest {extension_manifest} lacks key or gecko id"
        ) from err
    return extension_id_from_key(key), gecko_id


# --- locations -------------------------------------------------------------------


def _platform(platform: str | None) -> str:
    name = platform or sys.platform
    if name.startswith("linux"):
        return "linux"
    if name == "darwin":
        return "darwin"
    raise InvalidInput(f"per-user install supports Linux and macOS, not {name!r}")


def _home(home: Path | None) -> Path:
    return Path(home) if home is not None else Path.home()


def manifest_path(browser: str, *, home: Path | None = None, platform: str | None = None) -> Path:
    """Where ``browser`` looks for the LocalKB host manifest for this user."""
    if browser not in _LOCATIONS:
        raise InvalidInput(f"unknown browser {browser!r}; choose from {', '.join(BROWSERS)}")
    parts, _ = _LOCATIONS[browser][_platform(platform)]
    return _home(home).joinpath(*parts, MANIFEST_FILE)


def launcher_path(*, home: Path | None = None, platform: str | None = None) -> Path:
    """The launcher script's path: the per-user data directory, stable across runs."""
    if _platform(platform) == "darwin":
        return _home(home).joinpath(*_MAC_SUPPORT, "localkb", LAUNCHER_NAME)
    return _home(home) / ".local" / "share" / "localkb" / LAUNCHER_NAME


def detect_browsers(*, home: Path | None = None, platform: str | None = None) -> list[str]:
    """Browsers whose per-user config directory exists."""
    plat = _platform(platform)
    base = _home(home)
    return [b for b in BROWSERS if any(base.joinpath(*p).is_dir() for p in _LOCATIONS[b][plat][1])]


def _resolve_browsers(
    browsers: Sequence[str] | None, home: Path | None, platform: str | None
) -> list[str]:
    if browsers is None:
        return detect_browsers(home=home, platform=platform)
    chosen: list[str] = []
    for name in browsers:
        names = BROWSERS if name == "all" else (name,)
        for b in names:
            if b not in _LOCATIONS:
                raise InvalidInput(
                    f"unknown browser {b!r}; choose from {', '.join(BROWSERS)} or all"
                )
            if b not in chosen:
                chosen.append(b)
    return chosen


# --- writing ---------------------------------------------------------------------


def _safe_parent(path: Path) -> None:
    """Create ``path``'s folder (and missing parents) 0755, and never leave it writable by others.

    Whoever can write the folder holding the launcher or a manifest can swap it for a program
    of their own that the browser then runs as this user, so the umask is not trusted: folders
    are created with their mode stated, and group/other write is taken off the one holding the
    file (it is the user's own).
    """
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o755, exist_ok=True)
        os.chmod(p, 0o755)  # noqa: S103 - browsers' config folders: readable, never writable by others
    mode = stat.S_IMODE(path.parent.stat().st_mode)
    if mode & 0o022:
        os.chmod(path.parent, mode & ~0o022)


def _write_atomic(path: Path, text: str, mode: int) -> None:
    _safe_parent(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    # O_EXCL and 0600 from the first instant: nobody else can open the file before its mode
    # is set (a writable descriptor opened in that moment would outlive the chmod).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        os.fchmod(fh.fileno(), mode)
    os.replace(tmp, path)


def launcher_script(command: Sequence[str], localkb_home: Path | None = None) -> str:
    """The launcher's text: exec ``command`` with the browser's arguments appended."""
    lines = ["#!/bin/sh", "# Written by `localkb install`; the browser starts this."]
    if localkb_home is not None:
        lines.append(f"LOCALKB_HOME={shlex.quote(str(localkb_home))}")
        lines.append("export LOCALKB_HOME")
    lines.append("exec " + " ".join(shlex.quote(c) for c in command) + ' "$@"')
    return "\n".join(lines) + "\n"


def _fill(value: Any, subs: dict[str, str]) -> Any:
    # Substitute in parsed JSON strings, never in raw text, so a path containing
    # quotes or backslashes cannot break the manifest.
    if isinstance(value, str):
        for placeholder, real in subs.items():
            value = value.replace(placeholder, real)
        return value
    if isinstance(value, list):
        return [_fill(v, subs) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, subs) for k, v in value.items()}
    return value


def host_manifest(browser: str, launcher: Path) -> dict:
    """The manifest dict for ``browser``, from its template in ``manifest/``."""
    template_name = "firefox.json" if browser == "firefox" else "chromium.json"
    template = TEMPLATE_DIR / template_name
    try:
        data = json.loads(template.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise NotFound(f"host manifest template not found at {template}") from err
    chrome_id, gecko_id = extension_ids()
    return _fill(
        data,
        {"@LAUNCHER@": str(launcher), "@EXTENSION_ID@": chrome_id, "@GECKO_ID@": gecko_id},
    )


def install(
    browsers: Sequence[str] | None = None,
    *,
    home: Path | None = None,
    python: str | None = None,
    command: Sequence[str] | None = None,
    localkb_home: Path | None = None,
    platform: str | None = None,
) -> list[InstallResult]:
    """Write the launcher and one manifest per browser; return what was written.

    ``browsers``: names from ``BROWSERS`` or ``"all"``; ``None`` means every browser
    whose config directory exists (an empty list back means none was found).
    ``command`` replaces ``[python, "-m", "localkb", "host"]`` as what the launcher
    runs. ``localkb_home`` defaults to ``$LOCALKB_HOME`` when that is set.
    """
    chosen = _resolve_browsers(browsers, home, platform)
    if not chosen:
        return []
    argv = list(command) if command else [python or sys.executable, "-m", "localkb", "host"]
    if localkb_home is None and os.environ.get("LOCALKB_HOME"):
        localkb_home = Path(os.environ["LOCALKB_HOME"]).expanduser().absolute()
    launcher = launcher_path(home=home, platform=platform)
    manifests = [(b, host_manifest(b, launcher)) for b in chosen]  # fail before writing
    # The launcher lives in the per-user data directory: 0700 like the rest of it.
    private_dir(launcher.parent)
    _write_atomic(launcher, launcher_script(argv, localkb_home), 0o700)
    results = []
    for browser, manifest in manifests:
        path = manifest_path(browser, home=home, platform=platform)
        _write_atomic(path, json.dumps(manifest, indent=2) + "\n", 0o644)
        results.append(InstallResult(browser, path, launcher))
    return results


def uninstall(
    browsers: Sequence[str] | None = None,
    *,
    home: Path | None = None,
    platform: str | None = None,
) -> list[UninstallResult]:
    """Remove the manifests (default: every browser); the launcher goes with the last one."""
    chosen = _resolve_browsers(browsers if browsers is not None else ["all"], home, platform)
    results = []
    for browser in chosen:
        path = manifest_path(browser, home=home, platform=platform)
        try:
            path.unlink()
            removed = True
        except FileNotFoundError:
            removed = False
        results.append(UninstallResult(browser, path, removed))
    still_used = any(manifest_path(b, home=home, platform=platform).exists() for b in BROWSERS)
    if not still_used:
        launcher_path(home=home, platform=platform).unlink(missing_ok=True)
    return results


# --- checking --------------------------------------------------------------------


def _ask_status(argv: list[str], timeout: float) -> tuple[bool, str | None, str | None]:
    """Send one framed status request to a launcher; (answered, version, problem)."""
    request = protocol.encode_frame({"id": "check", "type": "status", "data": {}})
    try:
        # Closing stdin after the request is a clean hang-up: the host answers, exits 0.
        proc = subprocess.run(
            argv, input=request, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return False, None, f"launcher did not answer within {timeout:g} s"
    except OSError as err:
        return False, None, f"launcher could not start: {err}"
    stream = io.BytesIO(proc.stdout)
    parts: list[dict] = []
    while True:
        try:
            body = protocol.read_frame(stream)
            msg = json.loads(body) if body is not None else None
        except (protocol.ProtocolError, ValueError):
            return False, None, "launcher wrote something that is not a frame of JSON"
        if msg is None:
            break
        if not isinstance(msg, dict) or msg.get("id") != "check":
            continue
        if msg.get("event") == protocol.PART_EVENT:
            parts.append(msg.get("data", {}))
        elif "ok" in msg:
            if not msg["ok"]:
                err = msg.get("error", {})
                return False, None, f"status failed: {err.get('code')}: {err.get('message')}"
            result = protocol.join_parts(parts) if parts else msg.get("result", {})
            version = result.get("host_version") if isinstance(result, dict) else None
            return True, version, None
    tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
    return False, None, f"no status reply (exit {proc.returncode}) {' '.join(tail)}".strip()


def _validate(browser: str, manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return "manifest is not a JSON object"
    if manifest.get("name") != HOST_NAME:
        return f"manifest name is {manifest.get('name')!r}, not {HOST_NAME!r}"
    if manifest.get("type") != "stdio":
        return "manifest type is not stdio"
    chrome_id, gecko_id = extension_ids()
    if browser == "firefox":
        if gecko_id not in (manifest.get("allowed_extensions") or []):
            return f"allowed_extensions does not list {gecko_id}"
    elif f"chrome-extension://{chrome_id}/" not in (manifest.get("allowed_origins") or []):
        return f"allowed_origins does not list chrome-extension://{chrome_id}/"
    path = manifest.get("path")
    if not isinstance(path, str) or not os.path.isabs(path):
        return "manifest path is not absolute"
    return None


def check(
    browsers: Sequence[str] | None = None,
    *,
    home: Path | None = None,
    platform: str | None = None,
    timeout: float = CHECK_TIMEOUT,
) -> list[CheckResult]:
    """Report each browser's registration (default: all) and whether its launcher answers."""
    chosen = _resolve_browsers(browsers if browsers is not None else ["all"], home, platform)
    chrome_id, gecko_id = extension_ids()
    results = []
    for browser in chosen:
        path = manifest_path(browser, home=home, platform=platform)
        if not path.exists():
            results.append(
                CheckResult(browser, path, False, False, None, False, False, None, "not installed")
            )
            continue
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            manifest, problem = None, f"manifest unreadable: {err}"
        else:
            problem = _validate(browser, manifest)
        valid = problem is None
        launcher = Path(manifest["path"]) if valid else None
        executable = launcher is not None and launcher.is_file() and os.access(launcher, os.X_OK)
        answered, version = False, None
        if valid and not executable:
            problem = f"launcher {launcher} is missing or not executable"
        elif valid:
            # The arguments each browser passes: Chrome the caller's origin, Firefox the
            # manifest path and the extension id.
            args = (
                [str(path), gecko_id]
                if browser == "firefox"
                else [f"chrome-extension://{chrome_id}/"]
            )
            answered, version, problem = _ask_status([str(launcher), *args], timeout)
        results.append(
            CheckResult(
                browser, path, True, valid, launcher, executable, answered, version, problem
            )
        )
    return results

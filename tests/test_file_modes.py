"""The data is the user's alone: the data dir is 0700 and every file in it 0600, whatever the
umask; an existing store is tightened when it is opened (said once in the host log); and
``localkb install`` never leaves a directory holding the launcher writable by others.

Everything runs as real subprocesses started with umask 000, the worst case.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from hostproc import HostProcess

HOST = [sys.executable, "-m", "localkb", "host"]


def cli(args: list[str], home: Path, *, env: dict | None = None, umask: int = 0) -> str:
    res = subprocess.run([sys.executable, "-m", "localkb", *args], capture_output=True, text=True,
                         env={**os.environ, "LOCALKB_HOME": str(home), **(env or {})},
                         umask=umask, timeout=300, input="", check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def loose(root: Path) -> list[str]:
    """Every path under ``root`` (itself included) that anyone but the owner may use."""
    bad = []
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        want = 0o700 if path.is_dir() else 0o600
        if mode & 0o077 or (path.is_dir() and mode != want):
            bad.append(f"{oct(mode)} {path.relative_to(root)}")
    return bad


def test_every_file_of_a_new_store_is_private_whatever_the_umask(tmp_path):
    home = tmp_path / "home"
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe turbine's spare valve is V-12.\n")
    cli(["kb", "create", "Docs"], home)
    cli(["add", "Docs", str(note)], home)
    cli(["search", "Docs", "spare valve"], home)
    cli(["config", "endpoint", "add", "local", "http://127.0.0.1:9/v1", "m"], home)
    cli(["export", "Docs", "-o", str(tmp_path / "docs.awkb")], home)
    cli(["import", str(tmp_path / "docs.awkb"), "--name", "Copy"], home)
    with HostProcess(HOST, home=home, umask=0) as host:
        assert host.request({"id": 1, "type": "status", "data": {}})["ok"]
        assert host.request({"id": 2, "type": "kb.import", "data": {"action": "begin"}})["ok"]
        assert host.request({"id": 3, "type": "source.add", "data": {
            "kb": "Docs", "url": "https://x.test/p", "title": "P", "text": "Valve V-7 opens."}})["ok"]
        uploads = list((home / "uploads").glob("*"))
        assert uploads and loose(home) == [], loose(home)  # while the upload is open, too
    assert (home / "logs" / "host.log").exists() and list(home.glob("kbs/*/*"))
    assert loose(home) == []


def test_an_existing_loose_store_is_tightened_on_open_and_the_log_says_so_once(tmp_path):
    home = tmp_path / "home"
    cli(["kb", "create", "Docs"], home, umask=0o022)
    for path in [home, *home.rglob("*")]:  # as an older version left it: 0755 / 0644
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    (home / "logs").mkdir(exist_ok=True)
    os.chmod(home / "logs", 0o755)
    (home / "logs" / "host.log").touch()
    os.chmod(home / "logs" / "host.log", 0o644)
    for _ in range(2):
        with HostProcess(HOST, home=home) as host:
            assert host.request({"id": 1, "type": "kb.list", "data": {}})["ok"]
    assert loose(home) == []
    log = (home / "logs" / "host.log").read_text()
    assert log.count("tightened") == 1, log


def test_install_leaves_no_directory_holding_the_launcher_writable_by_others(tmp_path):
    user = tmp_path / "user"
    (user / ".config" / "chromium").mkdir(parents=True)
    env = {"HOME": str(user)}
    res = subprocess.run([sys.executable, "-m", "localkb", "install", "--browser", "chromium"],
                         capture_output=True, text=True, env={**os.environ, **env}, umask=0,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    launcher = user / ".local" / "share" / "localkb" / "localkb-host"
    manifest = user / ".config" / "chromium" / "NativeMessagingHosts" / "com.localkb.host.json"
    assert launcher.exists() and manifest.exists()
    for path in (launcher, *launcher.parents):
        if path == tmp_path:
            break
        mode = stat.S_IMODE(path.stat().st_mode)
        assert not mode & 0o022, f"{oct(mode)} {path}"
    for path in (manifest, manifest.parent):
        assert not stat.S_IMODE(path.stat().st_mode) & 0o022, path
    assert os.access(launcher, os.X_OK)

"""File modes: the data directory is the user's alone.

The data dir is 0700 and everything in it 0600 (0700 for directories and executables),
whatever the umask: the entry points (the CLI and the host) set umask 077 before they create
anything, ``private_dir`` creates directories with the mode stated rather than the umask's,
and ``tighten`` brings an existing store (one an older version or another umask left
readable) back to those modes when it is opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
_log = logging.getLogger("localkb.store")


def private_umask() -> None:
    """From now on this process creates files 0600 and directories 0700 (entry points only)."""
    os.umask(PRIVATE_UMASK)


def create_private_file(path: Path) -> int:
    """Create ``path`` (0600; it must not exist) in a private folder; its open descriptor.

    Job folders (imports, uploads) are removed once empty: a folder another process removes
    between its creation and the file's is made again.
    """
    for attempt in range(3):
        private_dir(path.parent)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def private_dir(path: Path) -> Path:
    """``path`` (and missing parents) created 0700; an existing one made 0700 if it is ours."""
    path = Path(path)
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=0o700)
        _chmod(p, 0o700)
    if path.is_dir() and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != 0o700:
        _chmod(path, 0o700)
    return path


def _chmod(path: Path, mode: int) -> bool:
    try:
        if path.stat(follow_symlinks=False).st_uid != os.geteuid():
            return False
        os.chmod(path, mode, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return False
    return True


def tighten(root: Path) -> int:
    """Strip group and other bits from everything under ``root``; return how many were loose.

    Directories become 0700, files keep only their owner bits (0644 -> 0600, 0755 -> 0700).
    Symbolic links are neither followed nor changed. Logged once, when anything changed.
    """
    root = Path(root)
    changed = 0
    stack = [root]
    while stack:
        here = stack.pop()
        try:
            info = here.stat(follow_symlinks=False)
        except OSError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            if mode != 0o700 and _chmod(here, 0o700):
                changed += 1
            try:
                stack.extend(Path(e.path) for e in os.scandir(here))
            except OSError:
                continue
        elif stat.S_ISREG(info.st_mode) and mode & 0o077 and _chmod(here, mode & 0o700):
            changed += 1
    if changed:
        _log.warning("tightened the modes of %d files and folders in %s: the data directory was "
                     "readable by other users; it is now 0700, its files 0600", changed, root)
    return changed

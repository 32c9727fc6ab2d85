"""Write files so a crash never leaves a half-written one in place."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

_TMP = re.compile(r"^\..+\.(\d+)\.tmp$")
#: Temporary files and folders without a process id in their name are swept once this old.
STALE_SECONDS = 3600


def tmp_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def replace_into(tmp: Path, path: Path) -> None:
    """fsync the finished temporary file, then rename it over ``path``."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: dict, mode: int | None = None) -> None:
    tmp = tmp_path_for(path)
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    if mode is not None:
        os.chmod(tmp, mode)
    replace_into(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True


def sweep_tmp(root: Path, kbs: Path) -> int:
    """Remove the temporary files a killed writer left in ``root`` and each folder of ``kbs``.

    ``.<name>.<pid>.tmp`` (``tmp_path_for``) goes when that process is gone; a temporary file
    or ``.export-*`` folder without a pid goes when it is older than ``STALE_SECONDS``.
    Returns how many were removed.
    """
    folders = [Path(root)] + ([p for p in Path(kbs).iterdir() if p.is_dir()] if Path(kbs).is_dir() else [])
    cutoff = time.time() - STALE_SECONDS
    removed = 0
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if not name.startswith("."):
                continue
            try:
                m = _TMP.match(name)
                if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
                    os.unlink(entry.path)
                elif (name.endswith(".tmp") and not m) or name.startswith(".export-"):
                    if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                else:
                    continue
                removed += 1
            except OSError:
                continue
    return removed

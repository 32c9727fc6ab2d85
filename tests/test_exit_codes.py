"""Exit codes a script can trust, from the real CLI: 0 all stored, 10 some stored and some
failed, 5 nothing stored, 2 bad usage, 130 interrupted (``test_ingest_jobs.py``'s Ctrl-C test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    return home


TIDES = "# Tides\n\nThe spring tide floods the lower quay.\n"


def _folder(parent: Path, name: str, files: dict[str, str | bytes]) -> Path:
    folder = parent / name
    folder.mkdir()
    for file, content in files.items():
        (folder / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


def _add(home: Path, *items: Path | str) -> tuple[int, dict]:
    res = run_cli(["add", "Docs", *map(str, items), "--json"], home)
    return res.returncode, json.loads(res.stdout) if res.stdout.strip() else {}


def test_all_stored_exits_0(home, tmp_path):
    code, report = _add(home, _folder(tmp_path, "one", {"a.md": TIDES}) / "a.md")
    assert code == 0, report["summary"]


def test_some_stored_and_some_failed_exits_10(home, tmp_path):
    folder = _folder(tmp_path, "mixed", {"good.md": TIDES, "broken.pdf": b"%PDF-1.4 this is no PDF at all"})
    code, report = _add(home, folder)
    assert report["totals"]["by_status"]["added"] == 1 and report["totals"]["sources_failed"] == 1
    assert code == 10, report["summary"]


@pytest.mark.parametrize("content", [b"", b"  \n\n \t\n"], ids=["zero bytes", "blank"])
def test_a_named_empty_file_stores_nothing_and_exits_5(home, tmp_path, content):
    empty = tmp_path / "empty.md"
    empty.write_bytes(content)
    code, report = _add(home, empty)
    src = report["sources"][0]
    assert (src["status"], src["reason"]) == ("skipped", "empty"), src
    assert code == 5, report["summary"]


def test_empty_files_of_a_folder_are_skipped_alike_whether_0_bytes_or_blank(home, tmp_path):
    folder = _folder(tmp_path, "notes", {"a.md": TIDES, "zero.md": b"", "blank.txt": b" \n\n\t \n"})
    code, report = _add(home, folder)
    reasons = {Path(s["name"]).name: (s["status"], s["reason"]) for s in report["sources"]}
    assert reasons["zero.md"] == reasons["blank.txt"] == ("skipped", "empty"), reasons
    assert code == 0, report["summary"]


def test_a_folder_where_nothing_could_be_stored_exits_5(home, tmp_path):
    code, report = _add(home, _folder(tmp_path, "pictures", {"a.png": b"\x89PNG\r\n\x1a\n", "b.md": b""}))
    assert report["totals"]["skipped"] == 2
    assert code == 5, report["summary"]


def test_a_folder_with_stored_files_beside_skipped_ones_exits_0(home, tmp_path):
    folder = _folder(tmp_path, "notes", {"a.png": b"\x89PNG\r\n\x1a\n", "b.md": TIDES})
    code, report = _add(home, folder)
    assert code == 0, report["summary"]
    again, report = _add(home, folder)  # everything unchanged: all stored still
    assert again == 0, report["summary"]


def test_bad_usage_exits_2(home):
    assert run_cli(["add", "Docs"], home).returncode == 2  # no path given
    assert run_cli(["sync"], home).returncode == 2
    assert run_cli(["add", "Docs", "x.md", "--max-size", "lots"], home).returncode == 2


@pytest.mark.parametrize("args", [["--help"], ["add", "--help"], ["sync", "--help"]])
def test_help_lists_the_exit_codes(args, tmp_path):
    res = run_cli(args, tmp_path)
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for line in ("0 everything was stored", "10 some sources were stored, some failed",
                 "5 nothing was stored", "2 bad usage", "130 interrupted"):
        assert line in text, text

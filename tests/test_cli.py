"""The command line's edges: closed pipes, listings, removing by name, export to stdout, help, logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_pdf, run_cli
from localkb.cli import explain_table
from localkb.retrieval.search import Hit, SearchResult


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """A store with 150 one-passage sources (hashing model: quick) and a Docs knowledge base."""
    root = tmp_path_factory.mktemp("many")
    home = root / "home"
    run_cli(["kb", "create", "Many", "--model", "hashing-256"], home, check=True)
    folder = root / "notes"
    folder.mkdir()
    for i in range(150):
        (folder / f"n{i:03}.md").write_text(f"# Zeta note {149 - i:03}\n\nNote about widget {i} and cables.")
    run_cli(["add", "Many", str(folder)], home, check=True)
    return home


def _piped(home: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``localkb ARGS | head -1`` in a real shell pipeline."""
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    cmd = " ".join([sys.executable, "-m", "localkb", *(f"'{a}'" for a in args)]) + " | head -1"
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_a_closed_pipe_exits_cleanly(many):
    for args in (["sources", "Many", "--json"], ["search", "Many", "widget cables", "-k", "50"],
                 ["sources", "Many", "--limit", "150"]):
        res = _piped(many, args)
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr
        assert res.stdout.strip()


def test_sources_are_sorted_and_say_how_many_there_are(many):
    res = run_cli(["sources", "Many"], many)
    lines = res.stdout.strip().splitlines()
    titles = [line.split("Zeta note ")[1].split()[0] for line in lines[:-1]]
    assert len(titles) == 100 and titles == sorted(titles) and titles[0] == "000"
    assert lines[-1] == ("showing 1-100 of 150 sources (by title) — --limit/--offset for more, "
                         "--sort added|updated|title")
    rest = run_cli(["sources", "Many", "--offset", "100"], many).stdout.strip().splitlines()
    assert len(rest) == 51 and rest[-1].startswith("showing 101-150 of 150 sources")
    added = run_cli(["sources", "Many", "--sort", "added", "--limit", "3"], many).stdout
    assert "(by added)" in added


def test_sources_json_lists_every_source_as_one_document(many):
    out = json.loads(run_cli(["sources", "Many", "--json"], many).stdout)
    assert out["total"] == 150 and len(out["sources"]) == 150
    assert [s["title"] for s in out["sources"]] == sorted(s["title"] for s in out["sources"])
    assert all(s["path"].endswith(".md") for s in out["sources"])
    two = json.loads(run_cli(["sources", "Many", "--json", "--limit", "2", "--offset", "5"], many).stdout)
    assert [s["title"] for s in two["sources"]] == ["Zeta note 005", "Zeta note 006"]


def test_remove_by_title_file_name_path_or_id_and_several_matches_named(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs", "--model", "hashing-256"], home, check=True)
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "index.md").write_text(f"# Index {sub}\n\nThe {sub} index page.")
    (tmp_path / "a" / "guide.md").write_text("# User guide\n\nHow to use it.")
    make_pdf(tmp_path / "a" / "spec.pdf", ["The spec of the widget."])
    run_cli(["add", "Docs", str(tmp_path / "a"), str(tmp_path / "b")], home, check=True)
    elsewhere = tmp_path  # not the files' folder: the file name alone must do
    env = {**os.environ, "LOCALKB_HOME": str(home)}

    def remove(ref: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localkb", "remove", "Docs", ref], capture_output=True,
                              text=True, env=env, cwd=elsewhere, check=False)

    by_name = remove("spec.pdf")
    assert by_name.returncode == 0 and "removed spec.pdf (1 chunk)" in by_name.stdout
    assert remove("user guide").returncode == 0  # title, any case
    several = remove("index.md")
    assert several.returncode == 1
    assert "2 sources in 'Docs' match 'index.md'" in several.stderr
    assert "give the id or the full path" in several.stderr
    assert remove("a/index.md").returncode == 0  # the end of the path picks one
    listed = json.loads(run_cli(["sources", "Docs", "--json"], home).stdout)["sources"]
    assert [s["title"] for s in listed] == ["Index b"]
    assert remove(listed[0]["id"]).returncode == 0
    missing = remove("nothing.md")
    assert missing.returncode == 3 and "source_not_found" in missing.stderr


def test_export_to_stdout_writes_the_archive_there(many, tmp_path):
    env = {**os.environ, "LOCALKB_HOME": str(many)}
    target = tmp_path / "out.awkb"
    with open(target, "wb") as fh:
        res = subprocess.run([sys.executable, "-m", "localkb", "export", "Many", "-o", "-"], stdout=fh,
                             stderr=subprocess.PIPE, text=False, env=env, cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "-").exists()
    assert b"-> standard output" in res.stderr and b"150 sources" in res.stderr
    imported = run_cli(["import", str(target), "--name", "Copy"], many)
    assert imported.returncode == 0 and "150 sources" in imported.stdout


def test_search_and_ask_help_show_their_arguments():
    for cmd, arg in (("search", "QUERY"), ("ask", "QUESTION")):
        res = subprocess.run([sys.executable, "-m", "localkb", cmd, "--help"], capture_output=True, text=True,
                             check=False)
        usage = res.stdout.split("\n\n")[0]
        assert f"KB [KB ...] {arg}" in usage, res.stdout


def test_counts_of_one_are_singular(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs", "--model", "hashing-256"], home, check=True)
    (tmp_path / "a.md").write_text("# A\n\nOne short note.")
    out = run_cli(["add", "Docs", str(tmp_path / "a.md")], home).stdout
    assert "1 source: 1 added — 1 passage embedded" in out and "1 sources" not in out
    assert run_cli(["sources", "Docs"], home).stdout.strip().endswith("1 source (by title)")


def test_pdf_library_warnings_go_to_the_log_not_the_terminal(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs", "--model", "hashing-256"], home, check=True)
    pdf = make_pdf(tmp_path / "whole.pdf", ["A page about cables.", "A page about fuses."])
    data = pdf.read_bytes()
    cut = tmp_path / "truncated.pdf"
    cut.write_bytes(data[: data.rindex(b"%%EOF")])  # no end marker: pypdf warns and recovers
    res = run_cli(["add", "Docs", str(cut)], home)
    assert "EOF marker" not in res.stderr and "EOF marker" not in res.stdout
    assert "EOF marker not found" in (home / "logs" / "cli.log").read_text()


def _hit(title: str, cosine: float, *, relevant: bool, bm25: float | None = None) -> Hit:
    return Hit(kb="kb1", kb_name="Docs", chunk_id=title, source_id=title, title=title, url=None,
               file_name=None, chunk_index=0, chunk_count=1, page=None, text=title, score=0.5, cosine=cosine,
               bm25=bm25, matched_terms=2 if bm25 else 0, lists=["keyword"] if bm25 else ["vector"],
               relevant=relevant)


def test_explain_draws_a_counted_keyword_hit_above_the_cut_off_line():
    res = SearchResult(query="ERR_4521 disk", mode="hybrid", hits=[_hit("vector match", 0.62, relevant=True),
                                                    _hit("exact code", 0.21, relevant=True, bm25=7.5)],
                       weaker=[_hit("set aside", 0.30, relevant=False)], statuses=[], terms=["err_4521"],
                       cutoff=0.35, trace={})
    lines = explain_table(res).splitlines()
    line = next(i for i, text in enumerate(lines) if "cut-off 0.35 ──" in text)
    above = "\n".join(lines[:line])
    assert "exact code" in above and "vector match" in above
    assert "set aside" in "\n".join(lines[line:])


def _listing(home: Path, kb_id: str) -> dict:
    [meta] = (home / "kbs" / kb_id).glob("vectors-*.json")
    return json.loads(meta.read_text())


def test_kb_list_and_host_status_show_how_many_segments_each_index_has(tmp_path):
    """Every query walks every segment, so how many there are is shown where a user looks:
    ``kb list`` (a column, and in --json) and the host's ``status`` give the vector index's
    graph and flat segments and the keyword index's segments, read from the listings on
    disk (status opens no index), and they change when a compaction merges them."""
    from hostproc import HostProcess

    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(1100):  # past the fold line: one flat vector segment, compaction off
        (folder / f"n{i:04}.md").write_text(f"# Note {i}\n\nAbout widget {i} and cable {i % 7}.")
    off = {"LOCALKB_COMPACT": "off"}
    made = run_cli(["kb", "create", "Segs", "--model", "hashing-256", "--json"], home, check=True)
    kb_id = json.loads(made.stdout)["id"]
    run_cli(["add", "Segs", str(folder)], home, check=True, env=off)
    listing = _listing(home, kb_id)
    flat = sum(not s.get("graph", True) for s in listing["segments"])
    graph = sum(bool(s.get("graph", True)) for s in listing["segments"])
    assert flat == 1 and graph == 0

    def listed() -> dict:
        [row] = json.loads(run_cli(["kb", "list", "--json"], home, check=True, env=off).stdout)[
            "knowledge_bases"]
        return row["segments"]

    before = listed()
    assert before["vector_flat"] == 1 and before["vector_graph"] == 0
    assert before["keyword"] >= 1
    text = run_cli(["kb", "list"], home, check=True, env=off).stdout
    header, line = text.splitlines()[:2]
    assert "segments" in header
    assert f"1+{before['keyword']}" not in line  # the cell says which index is which
    assert f"vec 0g+1f kw {before['keyword']}" in line

    with HostProcess([sys.executable, "-m", "localkb", "host"], home=home, env=off) as host:
        reply = host.request({"id": 1, "type": "status", "data": {}})
        assert reply["ok"], reply
        [kb] = reply["result"]["knowledge_bases"]
    assert kb["segments"] == before
    assert kb["index_health"] == "ok", kb  # the listing of the engine in use (tantivy by default)

    run_cli(["kb", "compact", "Segs"], home, check=True, env=off)
    after = listed()
    assert after["vector_flat"] == 0 and after["vector_graph"] == 0
    assert after["keyword"] == before["keyword"]  # compaction is the vector index's


def test_an_import_returns_before_the_graph_and_a_detached_compaction_builds_it(tmp_path):
    """``localkb import`` lists the vectors flat and returns (the graph was half its time):
    ``kb list`` and ``doctor`` say the graph is due, searches answer exactly meanwhile, and
    the detached ``kb compact --auto`` the import starts (as a write does) builds it."""
    import time

    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(60):
        (folder / f"n{i:04}.md").write_text(f"# Note {i}\n\nAbout widget {i} and cable {i % 7}.")
    off = {"LOCALKB_COMPACT": "off"}
    run_cli(["kb", "create", "Orig", "--model", "hashing-256"], home, check=True)
    run_cli(["add", "Orig", str(folder)], home, check=True, env=off)
    archive = tmp_path / "orig.awkb"
    run_cli(["export", "Orig", "-o", str(archive)], home, check=True)
    ids = {}
    for name, env in (("Flat", off), ("Built", {})):
        made = json.loads(run_cli(["import", str(archive), "--name", name, "--json"], home,
                                  check=True, env=env).stdout)
        ids[name] = made["knowledge_base"]["id"]
    assert _listing(home, ids["Flat"])["base_graph"] is False
    report = json.loads(run_cli(["doctor", "--json"], home, env=off).stdout)
    [flat] = [k for k in report["knowledge_bases"] if k["name"] == "Flat"]
    assert flat["problems"] == [] and flat["vector_index"]["count"] == 60
    assert flat["vector_index"]["compaction_due"] == "graph of 60 vectors searched exactly until then"
    rows = json.loads(run_cli(["kb", "list", "--json"], home, check=True, env=off).stdout)["knowledge_bases"]
    assert {r["name"]: r["segments"]["vector_base"] for r in rows}["Flat"] == "flat"
    found = json.loads(run_cli(["search", "Flat", "widget 17 cable 3", "--json"], home, check=True,
                               env=off).stdout)
    assert found["hits"][0]["title"] == "Note 17"

    deadline = time.monotonic() + 180
    while not _listing(home, ids["Built"]).get("base_graph") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _listing(home, ids["Built"])["base_graph"] is True
    assert _listing(home, ids["Built"])["count"] == 60
    run_cli(["kb", "compact", "Flat"], home, check=True, env=off)
    report = json.loads(run_cli(["doctor", "--json"], home, env=off).stdout)
    assert report["clean"], report
    assert all(k["vector_index"]["compaction_due"] is None for k in report["knowledge_bases"])


def test_a_write_leaves_vector_compaction_to_a_detached_process_or_to_kb_compact(tmp_path):
    """A write past the fold line folds the log into a flat segment and returns; the merge or
    base rewrite that leaves due runs in a detached ``kb compact --auto`` (LOCALKB_COMPACT
    background, the default), or in the foreground with ``localkb kb compact``."""
    import time

    home = tmp_path / "home"
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(1100):  # past the fold line (1,024 changes): a flat segment, a new base due
        (folder / f"n{i:04}.md").write_text(f"# Note {i}\n\nAbout widget {i} and cable {i % 7}.")
    off = {"LOCALKB_COMPACT": "off"}
    ids = {}
    for name in ("Fore", "Back"):
        made = run_cli(["kb", "create", name, "--model", "hashing-256", "--json"], home, check=True)
        ids[name] = json.loads(made.stdout)["id"]
        run_cli(["add", name, str(folder)], home, check=True, env=off)
        assert _listing(home, ids[name])["segments"], name  # folded, not compacted
    report = json.loads(run_cli(["doctor", "--json"], home, env=off).stdout)
    due = {k["name"]: k["vector_index"]["compaction_due"] for k in report["knowledge_bases"]}
    assert due == {"Fore": "rewrite of 1 segments", "Back": "rewrite of 1 segments"}
    text = run_cli(["doctor"], home, env=off).stdout
    assert "compaction due" in text and "localkb kb compact" in text

    done = run_cli(["kb", "compact", "Fore", "--json"], home, check=True)
    result = json.loads(done.stdout)
    assert result["state"] == "compacted" and result["segments_after"]["flat"] == 0
    assert result["segments_after"]["base"] == 1100
    assert _listing(home, ids["Fore"])["segments"] == []
    again = run_cli(["kb", "compact", "Fore"], home, check=True)
    assert again.stdout.strip() == "Fore: nothing due"

    # Any write with compaction due starts it detached (here a remove), and returns at once.
    run_cli(["remove", "Back", "n0001.md"], home, check=True)
    deadline = time.monotonic() + 180
    while _listing(home, ids["Back"])["segments"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _listing(home, ids["Back"])["segments"] == []
    report = json.loads(run_cli(["doctor", "--json"], home).stdout)
    assert report["clean"], report
    counts = {k["name"]: (k["chunks"], k["vector_index"]["count"]) for k in report["knowledge_bases"]}
    assert counts == {"Fore": (1100, 1100), "Back": (1099, 1099)}
    found = json.loads(run_cli(["search", "Back", "widget 17 cable 3", "--mode", "keyword", "--json"], home,
                               check=True).stdout)
    assert found


def test_one_weaker_match_is_said_in_the_singular_and_the_cli_names_its_flag(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    (tmp_path / "tea.md").write_text("# Green tea\n\nSteep sencha at 70 degrees for two minutes.\n")
    run_cli(["add", "Docs", str(tmp_path / "tea.md")], home, check=True)
    query = "ideal water heat for brewing"  # no word in common: only the vector leg finds it
    far = {"LOCALKB_CUTOFF": "0.99"}
    probe = json.loads(run_cli(["search", "Docs", query, "--json"], home, env=far).stdout)
    below = run_cli(["search", "Docs", query], home, env=far).stdout
    assert "(1 passage below the cut-off set aside; --explain shows it)" in below, below
    near = {"LOCALKB_CUTOFF": f"{probe['weaker'][0]['cosine'] + 0.02:.4f}"}  # just above it: weaker
    weaker = run_cli(["search", "Docs", query], home, env=near).stdout
    assert "(1 weaker match set aside; --explain shows it)" in weaker, weaker
    answer = run_cli(["ask", "Docs", query, "--extractive"], home, env=near).stdout
    assert "There is 1 weaker match; ask again with --weaker to see it." in answer, answer

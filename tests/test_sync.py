"""`localkb sync` and `--watch`: the knowledge base follows the folder (real files, real store)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import count_embedded, run_cli
from hostproc import HostProcess
from localkb.errors import InvalidInput
from localkb.ingest import pipeline

HOST = [sys.executable, "-m", "localkb", "host"]


def note(folder: Path, name: str, topic: str, n: int = 3) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {topic.title()}\n\n" + "\n\n".join(
        f"The {topic} section {i} explains how the {topic} works on day {i}." for i in range(n)),
        encoding="utf-8")
    return path


def stored_names(kb) -> set[str]:
    return {Path(r[0][5:]).name for r in kb.catalog.db.execute("SELECT key FROM sources WHERE kb_id = ?",
                                                                 (kb.id,))}


def test_sync_follows_edits_deletes_and_renames(kb, tmp_path, monkeypatch):
    from localkb.ingest.sync import sync_folder

    folder = tmp_path / "docs"
    for name, topic in [("pump.md", "pump"), ("valve.md", "valve"), ("fuse.md", "fuse"),
                        ("sub/relay.md", "relay")]:
        note(folder, name, topic)
    first = sync_folder(kb, folder)
    assert first.totals()["by_status"]["added"] == 4 and stored_names(kb) == {"pump.md", "valve.md",
                                                                            "fuse.md", "relay.md"}
    note(folder, "pump.md", "pump", n=5)  # edited
    (folder / "valve.md").unlink()  # deleted
    (folder / "fuse.md").rename(folder / "sub" / "fuse-renamed.md")  # renamed
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    embedded = count_embedded(kb, monkeypatch)
    report = sync_folder(kb)  # the remembered folder
    by = report.totals()["by_status"]
    assert by["updated"] == 1 and by["unchanged"] == 1 and by["added"] == 1 and by["skipped"] == 1
    assert {r["name"].rsplit("/", 1)[-1] for r in report.removed_sources} == {"valve.md"}
    assert [(Path(a).name, Path(b).name) for a, b in report.renamed] == [("fuse.md", "fuse-renamed.md")]
    renamed = next(s for s in report.sources if s.name.endswith("fuse-renamed.md"))
    assert renamed.reused == renamed.total  # its passages were copied, not embedded again
    pump = next(s for s in report.sources if s.name.endswith("pump.md"))
    assert sum(embedded) == pump.updated + pump.added  # only the edited file met the model
    assert stored_names(kb) == {"pump.md", "fuse-renamed.md", "relay.md"}
    vi, ki = kb.indexes()
    assert len(vi) == ki.doc_count() == kb.catalog.counts(kb.id)["chunks"]
    # the rename is a rename: not also a removal, and its passages are not "added"
    assert "1 renamed" in report.summary and "1 removed" in report.summary, report.summary
    assert "2 removed" not in report.summary and "added" not in report.summary, report.summary


def test_a_folder_synced_at_a_new_path_is_moved_not_doubled(kb, tmp_path, monkeypatch):
    import shutil

    from localkb.ingest.sync import sync_folder

    old = tmp_path / "old" / "docs"
    for name, topic in [("pump.md", "pump"), ("valve.md", "valve"), ("sub/relay.md", "relay")]:
        note(old, name, topic)
    assert sync_folder(kb, old).totals()["by_status"]["added"] == 3
    new = tmp_path / "new" / "docs"
    shutil.copytree(old, new)
    note(new, "fuse.md", "fuse")  # one file more in the new place
    embedded = count_embedded(kb, monkeypatch)
    report = sync_folder(kb, new)
    files = sorted(p.name for p in new.rglob("*.md"))
    assert kb.catalog.counts(kb.id)["sources"] == len(files) == 4, stored_names(kb)
    assert sorted(Path(b).name for _a, b in report.moved) == ["pump.md", "relay.md", "valve.md"]
    assert all(a.startswith(str(old)) and b.startswith(str(new)) for a, b in report.moved)
    fuse = next(s for s in report.sources if s.name.endswith("fuse.md"))
    assert sum(embedded) == fuse.total  # the moved files met no model: their vectors were kept
    assert "3 moved" in report.summary and "1 added" in report.summary, report.summary
    assert "removed" not in report.summary, report.summary
    vi, ki = kb.indexes()
    assert len(vi) == ki.doc_count() == kb.catalog.counts(kb.id)["chunks"]


def test_sources_of_a_folder_no_longer_synced_are_reported_and_pruned_on_request(kb, tmp_path):
    from localkb.ingest.sync import sync_folder

    first, second = tmp_path / "first", tmp_path / "second"
    note(first, "pump.md", "pump")
    note(second, "valve.md", "valve")
    sync_folder(kb, first)
    report = sync_folder(kb, second)
    assert [Path(n).name for n in report.unsynced] == ["pump.md"] and not report.moved
    assert "1 from a folder no longer synced (--prune removes it)" in report.summary, report.summary
    assert stored_names(kb) == {"pump.md", "valve.md"}  # reported, not removed
    pruned = sync_folder(kb, second, prune=True)
    assert [Path(r["name"]).name for r in pruned.removed_sources] == ["pump.md"] and not pruned.unsynced
    assert stored_names(kb) == {"valve.md"}


def test_the_cli_says_moved_and_prunes_with_a_flag(tmp_path):
    import shutil

    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    old, new = tmp_path / "a" / "notes", tmp_path / "b" / "notes"
    note(old, "pump.md", "pump")
    note(old, "valve.md", "valve")
    run_cli(["sync", "Docs", str(old)], home, check=True)
    shutil.copytree(old, new)
    (new / "valve.md").unlink()
    moved = run_cli(["sync", "Docs", str(new)], home)
    assert moved.returncode == 0 and "1 moved" in moved.stdout, moved.stdout + moved.stderr
    assert "1 from a folder no longer synced (--prune removes it)" in moved.stdout, moved.stdout
    pruned = run_cli(["sync", "Docs", "--prune", "--json"], home)
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert [Path(r["name"]).name for r in json.loads(pruned.stdout)["removed_sources"]] == ["valve.md"]


def test_sync_remembers_the_folder_and_its_rules(kb, tmp_path):
    from localkb.ingest.sync import remembered, sync_folder

    folder = tmp_path / "docs"
    note(folder, "keep.md", "keep")
    note(folder, "drafts/skip.md", "draft")
    sync_folder(kb, folder, exclude=["drafts"])
    assert remembered(kb).exclude == ("drafts",)
    assert stored_names(kb) == {"keep.md"}
    note(folder, "more.md", "more")
    report = sync_folder(kb)
    assert report.folder == str(folder.resolve()) and stored_names(kb) == {"keep.md", "more.md"}
    sync_folder(kb, folder, exclude=[])  # rules given again replace the remembered ones
    assert stored_names(kb) == {"keep.md", "more.md", "skip.md"}


def test_sync_of_a_missing_folder_removes_nothing(kb, tmp_path):
    from localkb.ingest.sync import sync_folder

    folder = tmp_path / "usb"
    note(folder, "a.md", "alpha")
    sync_folder(kb, folder)
    (folder / "a.md").unlink()
    folder.rmdir()
    try:
        sync_folder(kb)
        raise AssertionError("a missing folder must not sync")
    except InvalidInput as err:
        assert "is not there (nothing was removed)" in str(err)
    assert stored_names(kb) == {"a.md"}


def test_sync_without_a_remembered_folder_says_how(kb):
    from localkb.ingest.sync import sync_folder

    try:
        sync_folder(kb)
        raise AssertionError("expected an error")
    except InvalidInput as err:
        assert "localkb sync Docs FOLDER" in str(err)


def test_a_file_that_fails_to_read_keeps_its_stored_version(kb, tmp_path, monkeypatch):
    from localkb.ingest.sync import sync_folder

    folder = tmp_path / "docs"
    path = note(folder, "a.md", "alpha")
    sync_folder(kb, folder)
    path.write_text(path.read_text() + "\n\nMore.", encoding="utf-8")
    from localkb.errors import InvalidDocument

    def broken(p, **kw):
        raise InvalidDocument("simulated read failure")

    monkeypatch.setattr(pipeline, "open_file", broken)
    report = sync_folder(kb)
    assert report.sources[0].status == "failed" and not report.removed_sources
    assert stored_names(kb) == {"a.md"}


def _reader(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def test_watch_picks_up_a_new_file_and_stops_cleanly(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    folder = tmp_path / "docs"
    note(folder, "first.md", "first")
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    cmd = [sys.executable, "-m", "localkb", "sync", "Docs", str(folder), "--watch", "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    try:
        first = json.loads(lines.get(timeout=300))
        assert first["totals"]["by_status"]["added"] == 1
        time.sleep(1.0)  # let the watcher start after the first sync (it starts right after it)
        note(folder, "second.md", "second")
        deadline = time.monotonic() + 120
        seen = None
        while time.monotonic() < deadline:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, proc.stderr.read()
            report = json.loads(line)
            if any(s["name"].endswith("second.md") and s["status"] == "added" for s in report["sources"]):
                seen = report
                break
        assert seen is not None, "the watch never added the new file"
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    listed = json.loads(run_cli(["sources", "Docs", "--json"], home).stdout)
    assert {s["title"] for s in listed["sources"]} == {"First", "Second"}
    assert json.loads(run_cli(["doctor", "--json"], home).stdout)["clean"]


def test_the_host_syncs_the_remembered_folder(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    folder = tmp_path / "docs"
    note(folder, "a.md", "alpha")
    assert run_cli(["sync", "Docs", str(folder)], home).returncode == 0
    note(folder, "b.md", "beta")
    (folder / "a.md").unlink()
    with HostProcess(HOST, home=home) as host:
        host.send({"id": 1, "type": "kb.sync", "data": {"kb": "Docs"}})
        msgs = host.until_reply(1)
        events, reply = msgs[:-1], msgs[-1]
        assert reply["ok"], reply
        result = reply["result"]
        assert result["folder"] == str(folder.resolve())
        assert result["totals"]["by_status"]["added"] == 1
        assert [r["name"].rsplit("/", 1)[-1] for r in result["removed_sources"]] == ["a.md"]
        assert events and all(e["event"] == "progress" for e in events)
        assert all({"sources_done", "sources_total", "passages", "rate", "eta_s"} <= set(e["data"])
                   for e in events)
        nothing = host.request({"id": 2, "type": "kb.sync", "data": {"kb": "Nope"}})
        assert nothing["error"]["code"] == "kb_not_found"


def test_the_host_prunes_a_folder_no_longer_synced_when_asked(tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    note(tmp_path / "first", "a.md", "alpha")
    note(tmp_path / "second", "b.md", "beta")
    run_cli(["sync", "Docs", str(tmp_path / "first")], home, check=True)
    run_cli(["sync", "Docs", str(tmp_path / "second")], home, check=True)
    with HostProcess(HOST, home=home) as host:
        kept = host.request({"id": 1, "type": "kb.sync", "data": {"kb": "Docs"}})
        assert [Path(p).name for p in kept["result"]["unsynced"]] == ["a.md"], kept
        pruned = host.request({"id": 2, "type": "kb.sync", "data": {"kb": "Docs", "prune": True}})
        assert [Path(r["name"]).name for r in pruned["result"]["removed_sources"]] == ["a.md"], pruned
        assert pruned["result"]["unsynced"] == []

"""A bench run with ``--record`` appends one dated entry to RESULTS.md's bench log."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ENTRY = re.compile(
    r"\n### (?P<date>\d{4}-\d{2}-\d{2}) · (?P<commit>[0-9a-f]{7,40}(?: \(with uncommitted changes\))?)"
    r" · `(?P<command>[^`\n]+)`\n\n(?P<fence>`{3,})text\n(?P<printed>.*)\n(?P=fence)\n\Z",
    re.DOTALL,
)


def test_record_appends_one_entry_and_leaves_the_rest_byte_identical(tmp_path):
    results = tmp_path / "RESULTS.md"
    shutil.copyfile(REPO / "RESULTS.md", results)
    before = results.read_bytes()
    assert b"\n## Bench log\n" in before
    env = {**os.environ, "LOCALKB_RESULTS": str(results), "LOCALKB_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "host"), os.environ.get("PYTHONPATH")]))}
    argv = ["bench/pagechat.py", "--pages", "3", "--rounds", "1", "--questions", "1", "--record"]
    run = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    after = results.read_bytes()
    assert after.startswith(before), "the bench changed RESULTS.md above its new entry"
    added = after[len(before):].decode("utf-8")
    entry = ENTRY.fullmatch(added) or ENTRY.match(added)
    assert entry, f"not one well-formed entry: {added!r}"
    assert added.count("\n### ") == 1, f"more than one entry appended: {added!r}"
    assert entry["command"] == "python " + " ".join(argv)
    assert entry["printed"] == run.stdout.rstrip("\n"), "the entry is not what the bench printed"
    assert "median over 1 questions per side" in entry["printed"]

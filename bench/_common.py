"""Shared by the benchmarks: where SciFact is, a fallback text generator, how rounds are
interleaved, and ``--record``, which appends what a bench printed to RESULTS.md."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# shared/ sits beside the checkout (or beside the folder of worktrees); SCIFACT (or
# LOCALKB_SCIFACT) overrides.
_GIVEN = os.environ.get("SCIFACT") or os.environ.get("LOCALKB_SCIFACT")
SCIFACT = Path(_GIVEN) if _GIVEN else next(
    (p / "shared" / "datasets" / "beir-scifact" for p in (REPO.parent, REPO.parent.parent)
     if (p / "shared").is_dir()), REPO.parent / "shared" / "datasets" / "beir-scifact")


def scifact_docs(limit: int | None = None) -> list[dict]:
    """SciFact abstracts ({_id, title, text}); generated text when the data set is absent."""
    path = SCIFACT / "corpus.jsonl"
    if path.exists():
        docs = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                docs.append(json.loads(line))
                if limit and len(docs) >= limit:
                    break
        return docs
    rng = random.Random(7)
    words = ("cell protein gene expression tumour immune response patient cohort trial dose "
             "receptor pathway mouse model signal increase decrease risk association").split()
    return [{"_id": str(i), "title": " ".join(rng.choices(words, k=8)),
             "text": ". ".join(" ".join(rng.choices(words, k=18)) for _ in range(9)) + "."}
            for i in range(limit or 2000)]


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB: VmHWM, not ``ru_maxrss``.

    A child's ``ru_maxrss`` starts at its parent's RSS (fork, and exec keeps the maximum),
    so a case run in a subprocess of a bench that had loaded the model would be inflated.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def installed_env(env: dict[str, str], cache: Path) -> dict[str, str]:
    """``env`` for a new process that starts as an installed LocalKB does: from bytecode.

    ``pip install .`` and ``pipx install .`` compile the package at install time, and Python
    writes the bytecode of a source tree on its first import. A shell with
    ``PYTHONDONTWRITEBYTECODE`` (this machine's) and an editable install has neither, so every
    process compiled LocalKB's own modules again: 150-250 ms of each "cold" start measured here
    was that, not LocalKB. The package is compiled once into ``cache`` (``PYTHONPYCACHEPREFIX``),
    the source tree is left untouched, and the processes started with the result read it.
    """
    import subprocess
    import sys

    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(cache)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "host" / "localkb")],
                   env=out, check=True, capture_output=True)
    return out


def source_tree_start() -> str:
    """How this shell starts LocalKB from its source tree, for the cold-start lines."""
    return f"bytecode {'not written' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'written'}"


def rotated(items: list, r: int) -> list:
    """``items`` in round ``r``'s order: rotated by ``r``, so each goes first in turn (A/B, B/A, ...).

    Benches that compare things time each once per round in this order, so load on a
    shared machine falls on all of them alike.
    """
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def spread(values: list[float], fmt: str = ".2f") -> str:
    """min/median/max of ``values``, the way every bench prints a figure measured over rounds."""
    return "/".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


BENCH_LOG = "## Bench log"


def results_path() -> Path:
    """The results file ``--record`` appends to: RESULTS.md at the root (``LOCALKB_RESULTS`` overrides)."""
    return Path(os.environ.get("LOCALKB_RESULTS") or REPO / "RESULTS.md")


def _commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "host", "bench", "evals")
    return f"{head} (with uncommitted changes)" if dirty else head


def record(printed: str, command: str, path: Path | None = None) -> None:
    """Append one entry (UTC date, commit, the command line, what it printed) to the bench log.

    The entry goes at the end of the file, under ``## Bench log`` (added when missing), so
    everything above it stays byte for byte as it was.
    """
    path = path or results_path()
    text = path.read_text(encoding="utf-8") if path.exists() else "# LocalKB — results\n"
    head = "" if text.endswith("\n") else "\n"
    if f"\n{BENCH_LOG}\n" not in f"\n{text}":
        head += f"\n{BENCH_LOG}\n"
    body = printed.rstrip("\n")
    fence = "```"
    while fence in body:
        fence += "`"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    entry = f"{head}\n### {date} · {_commit()} · `{command}`\n\n{fence}text\n{body}\n{fence}\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(entry)


def add_record_flag(ap: argparse.ArgumentParser) -> None:
    """The ``--record`` flag every bench that prints a table takes."""
    ap.add_argument("--record", action="store_true",
                    help="append what this run prints, dated, to RESULTS.md's bench log "
                    "(LOCALKB_RESULTS: another file)")


class _Tee(io.TextIOBase):
    def __init__(self, out) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def recorded(on: bool, command: str | None = None) -> Iterator[None]:
    """Run the block; with ``on``, what it prints goes to stdout and, once it ends without an
    error, into the bench log as one entry (``command``: the line to show, default this one)."""
    if not on:
        yield
        return
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else Path(sys.argv[0])
    command = command or shlex.join(["python", str(shown), *sys.argv[1:]])
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    finally:
        sys.stdout = tee.out
    record(tee.kept.getvalue(), command)


if __name__ == "__main__":
    # python bench/_common.py record FILE COMMAND...: append FILE (a shell bench's output).
    if len(sys.argv) < 4 or sys.argv[1] != "record":
        sys.exit("usage: python bench/_common.py record PRINTED_FILE COMMAND...")
    record(Path(sys.argv[2]).read_text(encoding="utf-8"), shlex.join(sys.argv[3:]))

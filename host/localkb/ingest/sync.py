"""Keep a knowledge base in step with a folder: ``localkb sync`` and ``--watch``.

A sync adds the folder's new files, re-indexes the changed ones (unchanged ones are
recognised from a stat or a hash, see ``pipeline.py``), and removes the sources of files
that are gone, or that the rules now leave out or skip. A file that fails to read keeps
its stored version: a bad moment on disk never deletes what was saved. A deleted file
whose bytes reappear under another name is reported as renamed; its passages are copied,
not embedded again. If the folder itself is missing (an unmounted drive), nothing is
removed and the sync fails with the reason.

A knowledge base syncs one folder. Synced at a new path (the folder moved, or was copied),
the files whose bytes a source of the old folder holds are moves: the new sources take the
old ones' passages and vectors (a source's id follows its path, so the rows are copied and
nothing is embedded again) and the old sources go. Sources a sync once stored under a
folder it no longer syncs, not moved, are reported as ``unsynced`` and removed with
``prune``.

The folder and its include/exclude rules are remembered per knowledge base (in the
knowledge base's ``settings``), so ``localkb sync KB`` and the host's ``kb.sync`` run it
again. ``watch_folder`` syncs once, then again after each burst of changes (watchfiles,
debounced), until asked to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from localkb.errors import InvalidInput
from localkb.ingest.pipeline import CancelCheck, IngestReport, Progress, add_paths
from localkb.store.kb import Change, KnowledgeBase

#: Quiet time after the last change before a watch syncs (watchfiles' debounce), in ms.
DEBOUNCE_MS = 1_600


@dataclass
class SyncReport(IngestReport):
    """An add's report plus what the sync removed and what it recognised as renamed."""

    folder: str = ""
    removed_sources: list[dict] = field(default_factory=list)
    #: Files of the folder found under another name (from, to), and files of a folder this
    #: knowledge base synced before found in this one: their passages were kept.
    renamed: list[tuple[str, str]] = field(default_factory=list)
    moved: list[tuple[str, str]] = field(default_factory=list)
    #: Sources a sync stored under a folder it no longer syncs (kept until ``prune``).
    unsynced: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(folder=self.folder, removed_sources=self.removed_sources,
                   renamed=[{"from": a, "to": b} for a, b in self.renamed],
                   moved=[{"from": a, "to": b} for a, b in self.moved], unsynced=self.unsynced)
        return out

    def outcomes(self, by: dict[str, int]) -> list[str]:
        # A renamed or moved file is stored as an added source; it is counted as what it is.
        by = {**by, "added": by["added"] - len(self.renamed) - len(self.moved)}
        parts = super().outcomes(by)
        for n, what in ((len(self.renamed), "renamed"), (len(self.moved), "moved"),
                        (len(self.removed_sources), "removed")):
            if n:
                parts.append(f"{n} {what}")
        if self.unsynced:
            parts.append(f"{len(self.unsynced)} from a folder no longer synced (--prune removes "
                         f"{'it' if len(self.unsynced) == 1 else 'them'})")
        return parts


@dataclass(frozen=True)
class SyncRules:
    folder: Path
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"folder": str(self.folder), "include": list(self.include), "exclude": list(self.exclude)}


def remembered(kb: KnowledgeBase) -> SyncRules | None:
    """The folder and rules the last ``sync KB FOLDER`` remembered, if any."""
    rec = kb.catalog.kb(kb.id)
    raw = rec.settings.get("sync") if rec is not None else None
    if not isinstance(raw, dict) or not raw.get("folder"):
        return None
    return SyncRules(Path(raw["folder"]), tuple(raw.get("include") or ()), tuple(raw.get("exclude") or ()))


def remember(kb: KnowledgeBase, rules: SyncRules) -> None:
    """Keep the rules in the knowledge base's settings, beside its other settings (keyword engine)."""
    with kb.store.lock.hold():
        kb.catalog.update_settings(kb.id, sync=rules.to_dict())


def resolve_rules(kb: KnowledgeBase, folder: str | Path | None, include: Iterable[str] | None,
                  exclude: Iterable[str] | None) -> SyncRules:
    """The rules to sync with: those given (remembered for next time), else the remembered ones."""
    before = remembered(kb)
    if folder is None:
        if before is None:
            raise InvalidInput(f"no folder is remembered for {kb.record.name!r}: run "
                               f"`localkb sync {kb.record.name} FOLDER` once")
        folder = before.folder
    path = Path(folder).expanduser().resolve()
    same = before is not None and before.folder == path
    rules = SyncRules(
        path,
        tuple(include) if include is not None else (before.include if same else ()),
        tuple(exclude) if exclude is not None else (before.exclude if same else ()))
    if not path.is_dir():
        raise InvalidInput(f"the folder {path} is not there (nothing was removed); "
                           "mount it, or sync another folder")
    if rules != before:
        remember(kb, rules)
    return rules


def sync_folder(kb: KnowledgeBase, folder: str | Path | None = None, *,
                include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
                max_bytes: int | None = None, progress: Progress | None = None,
                check_cancelled: CancelCheck | None = None, prune: bool = False) -> SyncReport:
    """Make ``kb`` match the folder; see the module docstring. ``prune`` removes the sources
    of folders it no longer syncs."""
    rules = resolve_rules(kb, folder, include, exclude)
    base = add_paths(kb, [str(rules.folder)], captured_by="sync", include=rules.include,
                     exclude=rules.exclude, progress=progress, check_cancelled=check_cancelled,
                     max_bytes=max_bytes)
    report = SyncReport(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    report.folder = str(rules.folder)
    if report.interrupted:
        return report  # removals wait for a sync that saw the whole folder
    # Keep every file that is still a source candidate, including those that failed now
    # (their stored version stays); everything else under the folder goes.
    keep = {"file:" + str(Path(s.name).resolve()) for s in report.sources if s.status != "skipped"}
    prefix = "file:" + str(rules.folder).rstrip("/") + "/"
    rows = kb.catalog.db.execute(
        "SELECT s.id, s.key, s.title, s.captured_by, f.sha256 FROM sources s "
        "LEFT JOIN source_files f ON f.source_id = s.id WHERE s.kb_id = ? AND s.key LIKE 'file:%'",
        (kb.id,)).fetchall()
    inside = [r for r in rows if r["key"].startswith(prefix)]
    stale = [r for r in inside if r["key"] not in keep]
    # What a sync stored under another folder: this knowledge base synced it before.
    elsewhere = [r for r in rows if not r["key"].startswith(prefix) and r["captured_by"] == "sync"]
    added = {s.source_id for s in report.sources if s.status == "added"}
    new_hashes: dict[str, str] = {}
    for r in inside:
        if r["id"] in added and r["sha256"]:
            new_hashes.setdefault(r["sha256"], r["key"][5:])
    gone: list = []
    for r, here in [(r, True) for r in stale] + [(r, False) for r in elsewhere]:
        if r["sha256"] and r["sha256"] in new_hashes:  # its passages were copied to the new source
            (report.renamed if here else report.moved).append((r["key"][5:], new_hashes.pop(r["sha256"])))
            gone.append(r)
        elif here or prune:
            report.removed_sources.append(r)
            gone.append(r)
        else:
            report.unsynced.append(r["key"][5:])
    if gone:
        removed = _remove(kb, gone)
        dropped = {r["id"] for r in report.removed_sources}
        report.removed_sources = [d for d in removed if d["source_id"] in dropped]
    return report


def _remove(kb: KnowledgeBase, rows: list) -> list[dict]:
    """Remove these sources and their chunks in one write."""
    out: list[dict] = []

    def mutate(db) -> Change:
        change = Change()
        for r in rows:
            ids = [(c[0], c[1]) for c in db.execute("SELECT id, vkey FROM chunks WHERE source_id = ?",
                                                    (r["id"],))]
            db.execute("DELETE FROM chunks WHERE source_id = ?", (r["id"],))
            db.execute("DELETE FROM sources WHERE id = ?", (r["id"],))
            change.deleted.extend(ids)
            out.append({"source_id": r["id"], "name": r["key"][5:], "title": r["title"],
                        "removed_chunks": len(ids)})
        return change

    kb.write(mutate)
    return out


class _StopFlag:
    """What watchfiles polls to know when to stop (anything with ``is_set``)."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self._should_stop = should_stop

    def is_set(self) -> bool:
        return self._should_stop()


def watch_folder(kb: KnowledgeBase, folder: str | Path | None = None, *,
                 include: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
                 max_bytes: int | None = None, progress: Progress | None = None,
                 on_report: Callable[[SyncReport], None], should_stop: Callable[[], bool],
                 on_ready: Callable[[Path], None] | None = None,
                 debounce_ms: int = DEBOUNCE_MS) -> None:
    """Sync now, then after every burst of changes, until ``should_stop()``; each report to ``on_report``.

    A change in the middle of a sync is picked up by the next one; a stop request ends
    the running sync at its next safe point.
    """
    import watchfiles

    from localkb.errors import Cancelled

    rules = resolve_rules(kb, folder, include, exclude)

    def check() -> None:
        if should_stop():
            raise Cancelled("stopped")

    def once() -> None:
        report = sync_folder(kb, rules.folder, include=rules.include, exclude=rules.exclude,
                             max_bytes=max_bytes, progress=progress, check_cancelled=check)
        on_report(report)

    once()
    if on_ready:
        on_ready(rules.folder)
    stop = _StopFlag(should_stop)
    for _changes in watchfiles.watch(rules.folder, debounce=debounce_ms, step=50, stop_event=stop,
                                     rust_timeout=500, yield_on_timeout=False, raise_interrupt=False):
        if should_stop():
            break
        once()

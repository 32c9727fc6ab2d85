"""The ``localkb`` command: parse, call the core, print. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from localkb import __version__
from localkb.config import Settings
from localkb.errors import LocalKBError
from localkb.strings import plural

#: What ``add`` and ``sync`` exit with, for scripts (an error's own code is in ``EXIT_CODES``).
EXIT_STORED, EXIT_PARTIAL, EXIT_NOTHING, EXIT_USAGE, EXIT_INTERRUPTED = 0, 10, 5, 2, 130
INGEST_EXITS = """exit codes:
  0    everything was stored (added, updated or already unchanged); files of a folder
       skipped for their type or size do not count against it
  10   some sources were stored, some failed (each is listed with its reason)
  5    nothing was stored (every source failed or was skipped, a named file was empty)
  2    bad usage (a missing argument, an unknown option, a bad value)
  130  interrupted (Ctrl-C): what was written stays; run the same command to finish
  3 not found, 4 the model or a team server is unavailable, 1 any other error"""

EXIT_CODES = {"privacy_blocked": 6, "llm_unavailable": 7,
              "invalid_input": 2, "kb_not_found": 3, "source_not_found": 3, "not_found": 3,
              "embedding_unavailable": 4, "nothing_written": 5, "cancelled": 130,
              "invalid_archive": 2, "decryption_failed": 8, "passphrase_required": 8,
              "too_large": 2, "conflict": 2, "unauthorized": 9, "forbidden": 9, "team_unavailable": 4}


class Out:
    """Human text or JSON, never both."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def emit(self, data: object, text: str | Callable[[], str]) -> None:
        if self.json:
            print(json.dumps(data, indent=2, ensure_ascii=False, default=str))
        else:
            print(text() if callable(text) else text)


_OPENED: list = []  # the stores this command opened: their writes may have left compaction due


def _store(args):
    from localkb.store.kb import Store

    store = Store(Settings.from_env())
    _OPENED.append(store)
    return store


def _compact_after() -> None:
    """After a command that wrote: the vector compaction its writes left due, started
    detached like ``git gc --auto`` (a new session, stdio to /dev/null; a failure goes to
    the error log), so the command returns at once; or run here (``LOCALKB_COMPACT=inline``)."""
    import os
    import subprocess

    for store in _OPENED:
        for kb_id in sorted(store.compaction_due):
            if store.settings.compact == "off":
                continue
            if store.settings.compact == "inline":
                _compact_quietly(store, kb_id)
                continue
            try:
                subprocess.Popen([sys.executable, "-m", "localkb", "kb", "compact", kb_id, "--auto"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ))
            except OSError as err:  # the command's own work is done: say so in the error log only
                store.log_error("compaction", "index_unavailable", f"could not start: {err}", kb_id=kb_id)
    _OPENED.clear()


def _compact_quietly(store, kb_id: str) -> dict | None:
    try:
        return store.open_kb(kb_id).compact()
    except LocalKBError as err:
        store.log_error("compaction", err.code, str(err), kb_id=kb_id)
        return None


def cmd_kb_compact(args, out: Out) -> int:
    store = _store(args)
    kb = store.open_kb(args.kb)
    if args.auto:  # started by another command: quiet, errors to the error log
        _compact_quietly(store, kb.id)
        return 0
    result = kb.compact()

    def shape(s: dict) -> str:
        return f"base {s['base']:,}, {s['graph']} graph + {s['flat']} flat segments"

    def text() -> str:
        if result["state"] in {"nothing due", "already running"}:
            return f"{kb.record.name}: {result['state']}"
        steps = ", ".join(f"{s['kind']} of {s['inputs']} ({s['state']})" for s in result["steps"])
        return (f"{kb.record.name}: {result['state']}: {steps}; {shape(result['segments_before'])} -> "
                f"{shape(result['segments_after'])}; {result['seconds']:.2f} s")

    out.emit({"kb": kb.id, **result}, text)
    return 0


def _library(args):
    """The local store plus attached teams' knowledge bases (``localkb team attach``)."""
    from localkb.team.attached import Library

    return Library(_store(args))


# -- knowledge bases ---------------------------------------------------------------
def cmd_kb_create(args, out: Out) -> int:
    rec = _store(args).create_kb(args.name, privacy=args.privacy, model=args.model,
                                 keyword_engine=args.keyword_engine)
    out.emit(rec.public(), f"created {rec.name} ({rec.id}, {rec.privacy}, {rec.model})")
    return 0


def cmd_kb_list(args, out: Out) -> int:
    from localkb.store.listing import index_summary, segments_label

    library = _library(args)
    down = {t["team"]: t["error"] for t in library.refresh() if not t["ok"]}
    rows = []
    for rec in library.kbs():
        row = {"origin": "local", **rec.public(), **library.counts(rec.id)}
        if row["origin"] == "local":  # from the listings on disk: no index is opened
            row["segments"] = index_summary(library.local.kb_dir(rec.id), rec)["segments"]
        rows.append(row)
    for r in rows:
        if r.get("team") in down:
            r["unavailable"] = down[r["team"]]

    def text() -> str:
        if not rows:
            return "no knowledge bases yet: localkb kb create NAME"
        lines = [f"{'name':24} {'privacy':8} {'model':20} {'keywords':16} {'sources':>7} {'chunks':>7}  "
                 f"{'segments':16}  id"]
        lines += [f"{r['name'][:24]:24} {r['privacy']:8} {r['model'][:20]:20} "
                  f"{_engine_label(r):16} {r['sources']:>7} {r['chunks']:>7}  "
                  f"{segments_label(r.get('segments')) or '-':16}  {r['id']}"
                  + (f"  team {r['team']}" if r["origin"] == "team" else "")
                  + ("  (unreachable: last known listing)" if "unavailable" in r else "") for r in rows]
        return "\n".join(lines)

    out.emit({"knowledge_bases": rows}, text)
    return 0


def _engine_label(row: dict) -> str:
    """``tantivy (auto)``: the engine in use, and that ``auto`` chose it."""
    if row.get("origin") == "team":
        return "postgresql"  # the team server's full-text search
    choice = row.get("keyword_engine_choice", "auto")
    return row.get("keyword_engine", "?") + (" (auto)" if choice == "auto" else "")


def cmd_kb_update(args, out: Out) -> int:
    rec = _store(args).update_kb(args.kb, name=args.name, privacy=args.privacy,
                                 keyword_engine=args.keyword_engine)
    out.emit(rec.public(), f"updated {rec.name} ({rec.privacy}; keyword engine "
                           f"{_engine_label(rec.public())})")
    return 0


def cmd_kb_delete(args, out: Out) -> int:
    store = _store(args)
    rec = store.resolve(args.kb)
    if not args.yes and not out.json:
        counts = store.catalog.counts(rec.id)
        print(f"delete {rec.name} with {plural(counts['sources'], 'source')} and "
              f"{plural(counts['chunks'], 'chunk')}? (y/N) ", end="", flush=True)
        if sys.stdin.readline().strip().lower() not in {"y", "yes"}:
            print("kept")
            return 1
    store.delete_kb(rec.id)
    out.emit({"deleted": rec.id}, f"deleted {rec.name}")
    return 0


# -- sources -----------------------------------------------------------------------
class ProgressLine:
    """One line on stderr, redrawn in place: sources done of total, passages, rate, ETA, current.

    Drawn only on a terminal; the events come from the ingest's two threads.
    """

    def __init__(self, enabled: bool) -> None:
        import threading

        self.enabled = enabled
        self._lock = threading.Lock()
        self._shown = False

    def __call__(self, ev: dict) -> None:
        if not self.enabled:
            return
        if ev.get("stage") == "model":
            # The first add after an install builds the model: its own step, not a slow rate.
            line = ("preparing the embedding model (built once, on first use; about a minute)"
                    if ev.get("done", 0) < ev.get("total", 1) else "the embedding model is ready")
            with self._lock:
                sys.stderr.write("\r\033[K" + line)
                sys.stderr.flush()
                self._shown = True
            return
        total = ev.get("sources_total") or 0
        parts = [f"{ev.get('sources_done', 0):,}/{plural(total, 'source')}",
                 plural(ev.get("passages", 0), "passage")]
        rate, eta = ev.get("rate"), ev.get("eta_s")
        parts.append(f"{rate:,.0f} tokens/s" if rate else "rate: measuring")
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        line = " · ".join(parts)
        current = str(ev.get("current") or "")
        import shutil

        width = shutil.get_terminal_size((100, 20)).columns - 1
        room = width - len(line) - 3
        if current and room > 10:
            line += " · " + (current if len(current) <= room else "…" + current[-(room - 1):])
        with self._lock:
            sys.stderr.write("\r\033[K" + line[:width])
            sys.stderr.flush()
            self._shown = True

    def close(self) -> None:
        with self._lock:
            if self._shown:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
                self._shown = False


def _clock(seconds: float) -> str:
    from localkb.ingest.pipeline import clock

    return clock(seconds)


class StopOnInterrupt:
    """Ctrl-C asks the job to stop at its next safe point; a second Ctrl-C stops at once."""

    def __init__(self, before_message=None) -> None:
        self.requested = False
        self._before = before_message
        self._old = None

    def __enter__(self) -> StopOnInterrupt:
        import signal

        def handler(_sig, _frame) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True
            if self._before:
                self._before()
            print("stopping at the next safe point (Ctrl-C again to stop at once)", file=sys.stderr,
                  flush=True)

        try:
            self._old = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def check(self) -> None:
        if self.requested:
            from localkb.errors import Cancelled

            raise Cancelled("interrupted")


def _max_bytes(args) -> int | None:
    if getattr(args, "max_size", None) is None:
        return None
    from localkb.errors import InvalidInput
    from localkb.ingest.files import parse_size

    try:
        return parse_size(args.max_size)
    except ValueError as err:
        raise InvalidInput(str(err)) from err


def ingest_text(report, told: frozenset[str] = frozenset()) -> str:
    """Per-source lines (what changed, what was skipped or failed and why), then the final line.

    ``told``: sources whose line the caller wrote already (a sync's renames and moves)."""
    lines = []
    for s in report.sources:
        if (s.status == "unchanged" and not s.failed) or s.name in told:
            continue  # counted in the final line; listing hundreds of them helps no one
        mark = {"failed": "✗", "skipped": "-", "partial": "!"}.get(s.status, "✓")
        lines.append(f"{mark} {s.name}: {s.summary}")
    if report.excluded:
        lines.append(f"({plural(report.excluded, 'file')} or folders excluded by the rules or hidden)")
    lines.append(report.summary)
    if report.kept_line:
        lines.append(report.kept_line)
    return "\n".join(lines)


def ingest_exit(report) -> int:
    """``INGEST_EXITS``: all stored, some failed, nothing stored, interrupted."""
    if report.interrupted:
        return EXIT_INTERRUPTED
    totals = report.totals()
    by = totals["by_status"]
    stored = by["added"] + by["updated"] + by["unchanged"] + by["partial"]
    if not stored and (totals["sources_failed"] or totals["skipped"]):
        return EXIT_NOTHING
    return EXIT_PARTIAL if (totals["failed"] or totals["sources_failed"]) else EXIT_STORED


def cmd_add(args, out: Out) -> int:
    from localkb.ingest.pipeline import add_paths

    kb = _library(args).open_kb(args.kb)
    if getattr(kb, "remote", False):  # a team knowledge base: read here, extracted and written there
        from localkb.team.attached import upload_items

        report = upload_items(kb, args.items, settings=Settings.from_env(), include=args.include or (),
                              exclude=args.exclude or (), access=args.access)
        out.emit(report.to_dict(), lambda: ingest_text(report))
        return ingest_exit(report)
    if args.access is not None:
        from localkb.errors import InvalidInput

        raise InvalidInput("--access is for team knowledge bases")
    bar = ProgressLine(not out.json and sys.stderr.isatty())
    with StopOnInterrupt(bar.close) as stop:
        try:
            report = add_paths(kb, args.items, include=args.include or (), exclude=args.exclude or (),
                               progress=bar, check_cancelled=stop.check, max_bytes=_max_bytes(args))
        finally:
            bar.close()
    out.emit(report.to_dict(), lambda: ingest_text(report))
    return ingest_exit(report)


def cmd_sync(args, out: Out) -> int:
    from localkb.ingest.sync import sync_folder, watch_folder

    store = _store(args)
    kb = store.open_kb(args.kb)
    bar = ProgressLine(not out.json and sys.stderr.isatty())
    rules = {"include": args.include, "exclude": args.exclude}
    if args.watch:
        def each(report) -> None:
            bar.close()
            if out.json:
                print(json.dumps(report.to_dict(), ensure_ascii=False, default=str), flush=True)
            else:
                print(sync_text(report), flush=True)

        with StopOnInterrupt(bar.close) as stop:
            try:
                watch_folder(kb, args.folder, **rules, max_bytes=_max_bytes(args), progress=bar,
                             on_report=each, should_stop=lambda: stop.requested,
                             on_ready=lambda folder: None if out.json else print(
                                 f"watching {folder} (Ctrl-C stops)", file=sys.stderr, flush=True))
            finally:
                bar.close()
        if not out.json:
            print("stopped watching", file=sys.stderr)
        return 0
    with StopOnInterrupt(bar.close) as stop:
        try:
            report = sync_folder(kb, args.folder, **rules, max_bytes=_max_bytes(args), progress=bar,
                                 check_cancelled=stop.check, prune=args.prune)
        finally:
            bar.close()
    out.emit(report.to_dict(), lambda: sync_text(report))
    return ingest_exit(report)


def sync_text(report) -> str:
    lines = [f"sync {report.folder}:"]
    for r in report.removed_sources:
        lines.append(f"✓ {r['name']}: removed ({plural(r['removed_chunks'], 'passage')})")
    for what, pairs in (("renamed", report.renamed), ("moved", report.moved)):
        lines += [f"✓ {old} -> {new}: {what} (no passage embedded again)" for old, new in pairs]
    if report.unsynced:
        lines.append(f"{plural(len(report.unsynced), 'source')} of a folder this knowledge base no longer "
                     "syncs (kept until `--prune`): " + ", ".join(report.unsynced[:5])
                     + (" …" if len(report.unsynced) > 5 else ""))
    told = frozenset(new for _old, new in report.renamed + report.moved)
    return "\n".join([*lines, ingest_text(report, told)])


def cmd_sources(args, out: Out) -> int:
    from localkb.ingest.pipeline import iter_sources, list_sources

    kb = _library(args).open_kb(args.kb)
    if getattr(kb, "remote", False):  # a team knowledge base: what you may see of it
        rows, total = kb.list_sources(offset=args.offset, limit=args.limit or 100)
        out.emit({"sources": rows, "total": total}, lambda: "\n".join(
            [f"{r['id']}  {r['chunks']:>5} chunks  {r['access']:12} {r['title'][:60]}" for r in rows]
            + [f"{len(rows)} of {plural(total, 'source')} (team {kb.team.name})"]))
        return 0
    if out.json:
        # Streamed: one source at a time, however many there are.
        total = kb.catalog.counts(kb.id)["sources"]
        limit = args.limit
        sys.stdout.write(f'{{"total": {total}, "sources": [')
        for n, row in enumerate(iter_sources(kb, offset=args.offset, limit=limit, sort=args.sort)):
            sys.stdout.write(("," if n else "") + "\n  " + json.dumps(row, ensure_ascii=False, default=str))
        sys.stdout.write("\n]}\n")
        return 0
    rows, total = list_sources(kb, offset=args.offset, limit=args.limit or 100, sort=args.sort)
    if not rows:
        print(f"{kb.record.name} has no sources" if not total else
              f"no sources past {args.offset:,} (there are {total:,})")
        return 0
    for r in rows:
        where = r["url"] or r["path"] or ""
        print(f"{r['id']}  {r['chunks']:>5} {'chunk ' if r['chunks'] == 1 else 'chunks'}  {r['type']:8} "
              f"{r['title'][:60]}" + (f"  <{where}>" if where else ""))
    first, last = args.offset + 1, args.offset + len(rows)
    if len(rows) < total:
        print(f"showing {first:,}-{last:,} of {plural(total, 'source')} (by {args.sort}) — "
              "--limit/--offset for more, --sort added|updated|title")
    else:
        print(f"{plural(total, 'source')} (by {args.sort})")
    return 0


def cmd_remove(args, out: Out) -> int:
    from localkb.ingest.pipeline import remove_source

    kb = _library(args).open_kb(args.kb)
    res = kb.remove_source(args.source) if getattr(kb, "remote", False) else remove_source(kb, args.source)
    out.emit(res, f"removed {res['title']} ({plural(res['removed_chunks'], 'chunk')})")
    return 0


# -- search ------------------------------------------------------------------------
def cmd_search(args, out: Out) -> int:
    from localkb.retrieval.search import Reranker, Searcher, status_line

    store = _library(args)
    reranker = Reranker(args.rerank_model) if args.rerank_model else None
    res = Searcher(store, reranker=reranker).search(
        args.kb, args.query, k=args.k, mode=args.mode, cutoff=args.cutoff,
        rerank=bool(args.rerank_model), per_source=args.per_source)

    def text() -> str:
        lines = [status_line(s) for s in res.statuses]
        for s in res.statuses:
            if s.status == "unavailable" or s.degraded:
                lines.append(f"  {s.message}")
        for n, h in enumerate(res.hits, start=1):
            where = h.url or h.file_name or ""
            page = f", page {h.page}" if h.page else ""
            lines.append(f"[{n}] {h.title} ({h.kb_name}, chunk {h.chunk_index + 1}/{h.chunk_count}"
                         f"{page}) score {h.score:.3f} cos {_f(h.cosine)}")
            if where:
                lines.append(f"    {where}")
            lines.append("    " + h.text[:240].replace("\n", " ") + ("…" if len(h.text) > 240 else ""))
        if args.explain:
            lines += ["", explain_table(res)]
        elif res.weaker and not res.hits:
            n = len(res.weaker)
            what = (plural(n, "weaker match", "weaker matches")
                    if any(st.status == "weaker" for st in res.statuses)
                    else plural(n, "passage") + " below the cut-off")
            lines.append(f"({what} set aside; --explain shows {'it' if n == 1 else 'them'})")
        return "\n".join(lines)

    out.emit(res.to_dict(), text)
    return 0 if all(s.status != "unavailable" for s in res.statuses) else 4


def _f(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def explain_table(res) -> str:
    """Every candidate with fused score, cosine, BM25 and lists, the cut-off drawn across."""
    # Every hit that counts (a cosine over the cut-off, or a real keyword match) is drawn above
    # the line, whatever its cosine; the set-aside ones below it.
    rows = sorted(res.hits + res.weaker, key=lambda h: (h.relevant, h.cosine or -1), reverse=True)
    lines = [f"terms: {' '.join(res.terms) or '(none)'}    cut-off {res.cutoff:.2f} on cosine"]
    for kb_id, t in res.trace.get("kbs", {}).items():
        if t.get("weights"):
            name = next((s.kb_name for s in res.statuses if s.kb == kb_id), kb_id)
            lines.append(f"lists ({name}): " + ", ".join(
                f"{n} {t['candidates'].get(n, 0)} at weight {w:g}" for n, w in t["weights"].items()))
        if t.get("exact"):
            name = next((s.kb_name for s in res.statuses if s.kb == kb_id), kb_id)
            lines.append(f"exact terms ({name}): " + ", ".join(
                f"{term} {how}" for term, how in t["exact"].items()))
    lines += [f"{'cos':>6} {'fused':>6} {'bm25':>7} {'terms':>5}  {'lists':15} {'':3} passage"]
    drawn = False
    for h in rows:
        if not drawn and not h.relevant:
            lines.append(f"{'─' * 20} cut-off {res.cutoff:.2f} {'─' * 40}")
            drawn = True
        keep = "✓" if h.relevant else " "
        lines.append(f"{_f(h.cosine):>6} {h.score:6.3f} {_f(h.bm25):>7} {h.matched_terms:>5}  "
                     f"{'+'.join(h.lists):15} {keep:3} {h.kb_name}: {h.title[:30]} #{h.chunk_index + 1}")
    if not drawn:
        lines.append(f"{'─' * 20} cut-off {res.cutoff:.2f} {'─' * 40}")
    return "\n".join(lines)


# -- maintenance -------------------------------------------------------------------
def cmd_errors(args, out: Out) -> int:
    store = _store(args)
    kb_id = store.resolve(args.kb).id if args.kb else None
    rows, total = store.catalog.errors(source=args.source, kb_id=kb_id, limit=args.limit,
                                       offset=args.offset)

    def text() -> str:
        import datetime as dt

        if not rows:
            return "no errors logged"
        lines = [f"{dt.datetime.fromtimestamp(r['at']).isoformat(timespec='seconds')} "
                 f"{r['source']:14} {r['code']:22} {r['message'][:200]}" for r in rows]
        return "\n".join([*lines, f"{len(rows)} of {total} (--limit, --offset, --source to see more)"])

    out.emit({"errors": rows, "total": total}, text)
    return 0


def cmd_doctor(args, out: Out) -> int:
    from localkb.doctor import doctor

    report = doctor(_store(args), repair=args.repair)

    def text() -> str:
        m = report["model"]
        lines = [f"data dir: {report['data_dir']}",
                 f"model: {m['id']} ({m.get('variant')}) "
                 + ("ok" if m.get("ok") else f"UNAVAILABLE: {m.get('error')}")]
        for kb in report["knowledge_bases"]:
            state = "; ".join(kb["problems"]) or "; ".join(["ok", *kb.get("notes", [])])
            vec = kb.get("vector_index", {})
            if vec.get("compaction_due"):
                state += (f"; compaction due ({vec['compaction_due']}; {vec['graph_segments']} graph + "
                          f"{vec['flat_segments']} flat segments): localkb kb compact")
            lines.append(f"{kb['name']}: {plural(kb['chunks'], 'chunk')}, vectors "
                         f"{kb.get('vector_index', {}).get('count', '?')}, keywords "
                         f"{kb.get('keyword_index', {}).get('count', '?')}: {state}")
            if kb.get("repaired"):
                after = kb["problems_after_repair"]
                lines.append("  repaired" + (": still " + "; ".join(after) if after else ", now clean"))
        lines.append("clean" if report["clean"] else "problems found (localkb doctor --repair)")
        return "\n".join(lines)

    out.emit(report, text)
    return 0 if report["clean"] else 1


def cmd_eval(args, out: Out) -> int:
    from localkb.retrieval.evaluate import format_table, run_eval

    kw = {"modes": args.modes, "model": args.model, "k": args.k, "rerank_model": args.rerank_model,
          "limit_queries": args.limit_queries, "keyword_engine": args.keyword_engine,
          "baseline": args.baseline, "split": args.split, "index_dir": args.index_dir}
    if args.store == "team":
        from localkb.errors import InvalidInput
        from localkb.team.cli import throwaway_team_store

        if args.index_dir:
            raise InvalidInput("--index-dir keeps a local index; it does not go with --store team")
        with throwaway_team_store(args.db) as store:
            res = run_eval(args.path, store=store, **kw)
    else:
        res = run_eval(args.path, **kw)
    out.emit(res, lambda: format_table(res))
    return 0


def cmd_log(args, out: Out) -> int:
    rows, total = _store(args).catalog.queries(limit=args.limit, offset=args.offset)

    def text() -> str:
        import datetime as dt

        if not rows:
            return "the query log is empty"
        lines = []
        for r in rows:
            steps = r["trace"].get("statuses") or []
            lines.append(f"{dt.datetime.fromtimestamp(r['at']).isoformat(timespec='seconds')} "
                         f"{r['kind']:6} {r['query'][:80]!r} "
                         + " | ".join(s.get("line", s.get("status", "")) for s in steps))
        return "\n".join([*lines, f"{len(rows)} of {total}"])

    out.emit({"queries": rows, "total": total}, text)
    return 0


def cmd_install(args, out: Out) -> int:
    import os
    from pathlib import Path

    from localkb.native import install as inst

    browsers = args.browser or None
    if args.check:
        results = inst.check(browsers)
        rows = [{**r.__dict__, "manifest": str(r.manifest),
                 "launcher": str(r.launcher) if r.launcher else None} for r in results]

        chrome_id, gecko_id = inst.extension_ids()

        def text() -> str:
            lines = []
            for r in results:
                state = "ok, the host answers" if not r.problem else r.problem
                # Which extension the registration lets in: Firefox names it by its gecko id.
                allows = gecko_id if r.browser == "firefox" else f"chrome-extension://{chrome_id}/"
                lines.append(f"{r.browser:9} {r.manifest}: {state}"
                             + (f" (localkb {r.version})" if r.version else "")
                             + (f"; allows {allows}" if r.valid else ""))
            return "\n".join(lines) or "no browser found; name one with --browser"

        out.emit({"browsers": rows}, text)
        return 0 if results and all(r.problem is None for r in results if r.registered) else 1
    home = os.environ.get("LOCALKB_HOME")
    results = inst.install(browsers, localkb_home=Path(home) if home else None)
    chrome_id, gecko_id = inst.extension_ids()
    rows = [{"browser": r.browser, "manifest": str(r.manifest), "launcher": str(r.launcher)}
            for r in results]

    def text() -> str:
        lines = [f"registered for {r['browser']}: {r['manifest']}" for r in rows]
        if rows:
            lines.append(f"launcher: {rows[0]['launcher']}")
        lines.append(f"extension id: {chrome_id} (Chromium family), {gecko_id} (Firefox)")
        if any(r["browser"] == "firefox" for r in rows):
            lines.append("Firefox: `make firefox` writes build/firefox/; load its manifest.json from "
                         "about:debugging (This Firefox > Load Temporary Add-on)")
        return "\n".join(lines) if rows else "no browser found; name one with --browser"

    out.emit({"installed": rows, "extension_id": chrome_id, "firefox_id": gecko_id}, text)
    return 0 if rows else 1


def cmd_uninstall(args, out: Out) -> int:
    from localkb.native import install as inst

    results = inst.uninstall(args.browser or None)
    rows = [{"browser": r.browser, "manifest": str(r.manifest), "removed": r.removed} for r in results]
    out.emit({"uninstalled": rows},
             "\n".join(f"{r['browser']}: {'removed' if r['removed'] else 'nothing registered'}"
                       for r in rows) or "nothing registered")
    return 0


# -- chat --------------------------------------------------------------------------
def _chat_endpoint(args, store):
    from localkb.answer.llm import load_config

    if args.extractive:
        return None
    config = load_config(store.local.root)
    return config.get(args.endpoint) if args.endpoint else config.default


def _chat_turn(args, out: Out, store, message: str, history: list, *, cache, kind: str):
    """Run one turn, streaming step lines and tokens to the terminal; returns the ChatResult."""
    from localkb.answer.chat import ChatOptions, run_turn

    streamed: list[str] = []

    def on_step(status: dict) -> None:
        if not out.json:
            print(status["line"], flush=True)

    def on_token(text: str) -> None:
        if not out.json:
            if not streamed:
                print(flush=True)
            print(text, end="", flush=True)
            streamed.append(text)

    def confirm(request: dict) -> bool:
        if out.json:
            return False  # no one to ask: a model-driven write is never made unconfirmed
        # All of it: what is approved is exactly what is written.
        print(f"\n\nThe model asks to save “{request['title']}” ({request['chars']:,} characters) "
              f"to {request['kb_name']}:\n{request['text']}\n--- end of the text ---\nSave it? (y/N) ",
              end="", flush=True)
        return sys.stdin.readline().strip().lower() in {"y", "yes"}

    options = ChatOptions(use_weaker_matches=args.weaker, strict=args.strict, kind=kind,
                          ask_weaker="ask again with --weaker")
    result = run_turn(store, args.kb, message, history=history,
                      endpoint=_chat_endpoint(args, store), options=options, cache=cache,
                      on_step=on_step, on_token=on_token, confirm=confirm)
    if out.json:
        return result
    if streamed:
        print()
        if result.removed_citations:
            print(f"\nchecked answer:\n{result.answer}")
    else:
        print(f"\n{result.answer}")
    for note in result.notes:
        print(f"note: {note}")
    if result.rewritten_query:
        print(f"(searched as: {result.rewritten_query})")
    if result.cached:
        print(f"(from the {result.cached} answer cache)")
    for c in result.citations:
        page = f", page {c['page']}" if c["page"] else ""
        weaker = ", weaker match" if c["weaker"] else ""
        print(f"[{c['n']}] {c['title']} ({c['kb_name']}, chunk {c['chunk_index'] + 1}/"
              f"{c['chunk_count']}{page}{weaker}) score {c['score']:.3f}")
        if c["url"] or c["file_name"]:
            print(f"    {c['url'] or c['file_name']}")
    return result


def cmd_ask(args, out: Out) -> int:
    store = _library(args)
    result = _chat_turn(args, out, store, args.question, [], cache=None, kind="ask")
    if out.json:
        out.emit(result.to_dict(), "")
    return 4 if any(s["status"] == "unavailable" for s in result.statuses) else 0


def cmd_chat(args, out: Out) -> int:
    from localkb.answer.chat import AnswerCache, Turn

    store = _library(args)
    cache = AnswerCache()
    history: list[Turn] = []
    interactive = sys.stdin.isatty() and not out.json
    if interactive:
        print("Ask away; an empty line or Ctrl-D ends the chat.")
    while True:
        if interactive:
            print("\n> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or not line.strip():
            return 0
        message = line.strip()
        result = _chat_turn(args, out, store, message, history, cache=cache, kind="chat")
        if out.json:
            print(json.dumps(result.to_dict(), ensure_ascii=False, default=str), flush=True)
        history += [Turn("user", message), Turn("assistant", result.answer, tuple(result.kbs))]
        history = history[-20:]


def cmd_config_endpoint(args, out: Out) -> int:
    from localkb.answer.llm import LLMConfig, load_config, merge_endpoint, save_config

    root = Settings.from_env().data_dir
    config = load_config(root)
    endpoints = list(config.endpoints)
    default = config.default_endpoint
    note = None
    if args.action == "add":
        key = sys.stdin.readline().strip() if args.api_key_stdin else None
        endpoint, note = merge_endpoint(config, {
            "name": args.name, "base_url": args.base_url, "model": args.model,
            "api_key_env": args.api_key_env, "mark_cloud": args.mark_cloud,
            **({"api_key": key} if key else {})})
        endpoints = [e for e in endpoints if e.name != args.name] + [endpoint]
        if args.default or default is None:
            default = endpoint.name
    elif args.action == "remove":
        config.get(args.name)  # NotFound names the configured ones
        endpoints = [e for e in endpoints if e.name != args.name]
        default = None if default == args.name else default
    elif args.action == "default":
        if args.name is not None:
            config.get(args.name)
        default = args.name
    if args.action != "list":
        config = LLMConfig(endpoints=tuple(endpoints), default_endpoint=default)
        save_config(root, config)
    shown = config.public_dict()

    def text() -> str:
        if not shown["endpoints"]:
            return "no model endpoints: answers are extractive (localkb config endpoint add ...)"
        lines = []
        for e in shown["endpoints"]:
            mark = "*" if e["name"] == shown["default_endpoint"] else " "
            key = "key set" if e["api_key_set"] else "no key"
            where = e["location"] or "unknown (treated as cloud)"
            lines.append(f"{mark} {e['name']:16} {where:6} {e['model']:24} {e['base_url']} ({key})")
        if shown["default_endpoint"] is None:
            lines.append("no default: answers are extractive unless --endpoint is given")
        if note:
            lines.append(f"note: {note} (--api-key-stdin)")
        return "\n".join(lines)

    out.emit({**shown, "notes": [note] if note else []}, text)
    return 0


def cmd_model_build(args, out: Out) -> int:
    from localkb.embedding import build as modelbuild
    from localkb.embedding.embedder import select_minilm
    from localkb.errors import EmbeddingUnavailable

    settings = Settings.from_env()
    folder = settings.models_root / "minilm-built"
    chosen = select_minilm(settings, force_build=args.force)
    if "fallback" in chosen.selection:  # the embedder would fall back; this command reports failure
        raise EmbeddingUnavailable(chosen.selection["fallback"])
    info = modelbuild.read_build_info(folder) or {}
    result = {"folder": str(folder), "verified": info.get("verified"),
              "verification": info.get("verification"), "outputs": info.get("outputs"),
              "chosen": chosen.describe()}

    def text() -> str:
        v = info.get("verification") or {}
        lines = [f"built in {folder}: " + ("verified" if info.get("verified") else "NOT verified")]
        if v:
            lines.append(f"  built fp32 vs packaged int8: mean cosine {v.get('fp32_vs_packaged_mean')}; "
                         f"built int8 vs fp32: mean {v.get('int8_vs_fp32_mean')}, "
                         f"min {v.get('int8_vs_fp32_min')}; "
                         f"int8 alone vs in a batch: min {v.get('int8_alone_vs_batched_min')}")
        sel = chosen.selection
        if sel.get("tokens_per_s"):
            lines.append(f"  tokens/s on this machine (median of {sel.get('rounds', 1)} interleaved rounds): "
                         + ", ".join(
                f"{k} {v:,}" for k, v in sel["tokens_per_s"].items()))
        lines.append(f"the embedder uses: {chosen.variant}"
                     + (f" ({sel['fallback']})" if sel.get("fallback") else ""))
        return "\n".join(lines)

    out.emit(result, text)
    return 0


def cmd_host(args, out: Out) -> int:
    from localkb.native.host import main as host_main

    return host_main(args.browser_args)


# -- portable knowledge bases ------------------------------------------------------
def _passphrase(*, confirm: bool) -> str:
    """LOCALKB_PASSPHRASE for scripts, else a prompt (twice when encrypting)."""
    import getpass
    import os

    from localkb.errors import PassphraseRequired

    env = os.environ.get("LOCALKB_PASSPHRASE")
    if env:
        return env
    if not sys.stdin.isatty():
        raise PassphraseRequired("a passphrase is required: set LOCALKB_PASSPHRASE or run in a terminal")
    first = getpass.getpass("passphrase: ")
    if confirm and getpass.getpass("passphrase again: ") != first:
        raise PassphraseRequired("the two passphrases differ")
    if not first:
        raise PassphraseRequired("the passphrase is empty")
    return first


def _stage_bar(out: Out):
    """A progress callback drawing a tqdm bar on a terminal (nothing otherwise), and its closer."""
    if out.json or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="chunk", file=sys.stderr, leave=False)

    def progress(ev: dict) -> None:
        bar.total, bar.n = ev.get("total", 0), ev.get("done", 0)
        bar.set_description(str(ev.get("stage", "")))
        bar.refresh()

    return progress, bar.close


def cmd_export(args, out: Out) -> int:
    import shutil
    import tempfile
    from pathlib import Path

    from localkb.portable.archive import export_to_file

    library = _library(args)
    store = library.local
    kb = library.open_kb(args.kb)
    passphrase = _passphrase(confirm=True) if args.encrypt else None
    if getattr(kb, "remote", False):
        return _team_export(kb, args.output, passphrase, out)
    progress, done = _stage_bar(out)
    to_stdout = args.output == "-"
    if to_stdout and sys.stdout.isatty():
        from localkb.errors import InvalidInput

        raise InvalidInput("-o - writes the .awkb bytes to standard output: pipe or redirect it")
    try:
        if to_stdout:
            with tempfile.TemporaryDirectory(dir=store.root, prefix=".export-") as tmp:
                path = Path(tmp) / "out.awkb"
                report = export_to_file(kb, path, passphrase=passphrase, progress=progress)
                with open(path, "rb") as fh:
                    sys.stdout.flush()
                    shutil.copyfileobj(fh, sys.stdout.buffer)
                sys.stdout.buffer.flush()
            report.path = "-"
        else:
            report = export_to_file(kb, args.output, passphrase=passphrase, progress=progress)
    finally:
        done()
    line = (f"exported {report.name}: {plural(report.sources, 'source')}, {plural(report.chunks, 'chunk')}, "
            f"{report.bytes:,} bytes{' (encrypted)' if report.encrypted else ''} -> "
            f"{'standard output' if to_stdout else report.path}")
    if to_stdout:  # stdout carries the file: the report goes to stderr
        print(json.dumps(report.to_dict(), default=str) if out.json else line, file=sys.stderr)
    else:
        out.emit(report.to_dict(), line)
    return 0


def _team_export(kb, output: str, passphrase: str | None, out: Out) -> int:
    """A team knowledge base's .awkb (what you may see of it), sealed here with --encrypt."""
    import io
    import os
    from pathlib import Path

    from localkb.portable import envelope

    raw, headers = kb.export()
    if passphrase:
        sealed = io.BytesIO()
        envelope.seal(io.BytesIO(raw), sealed, passphrase)
        raw = sealed.getvalue()
    path = Path(output)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)
    res = {"path": str(path), "bytes": len(raw), "encrypted": bool(passphrase), "origin": "team",
           "sources": int(headers.get("x-localkb-sources", 0)),
           "chunks": int(headers.get("x-localkb-chunks", 0))}
    out.emit(res, f"exported {kb.record.name} from team {kb.team.name}: {plural(res['sources'], 'source')}, "
             f"{plural(res['chunks'], 'chunk')}, {len(raw):,} bytes -> {path}")
    return 0


def _team_import(args, out: Out, store, passphrase: str | None) -> int:
    """An .awkb file as a new team knowledge base (team administrators), decrypted here first."""
    import io
    import os

    from localkb.errors import NotFound
    from localkb.portable import envelope
    from localkb.team.attached import load_attachments

    team = next((t for t in load_attachments(store.root) if t.name.lower() == args.team.lower()), None)
    if team is None:
        raise NotFound(f"no team named {args.team!r} is attached (localkb team list)")
    with open(args.file, "rb") as fh:
        if passphrase is not None:
            plain = io.BytesIO()
            envelope.open_envelope(fh, plain, passphrase, size=os.fstat(fh.fileno()).st_size)
            raw = plain.getvalue()
        else:
            raw = fh.read()
    with team.client() as client:
        res = client.import_(raw, name=args.name, access=args.access)
    kb = res["knowledge_base"]
    out.emit(res, f"imported {kb['name']} ({kb['id']}) into team {team.name}: "
             f"{plural(res['sources'], 'source')}, {plural(res['chunks'], 'chunk')}, access {res['access']}")
    return 0


def cmd_import(args, out: Out) -> int:
    from localkb.errors import InvalidInput
    from localkb.portable.archive import import_kb, is_encrypted

    store = _store(args)
    try:
        encrypted = is_encrypted(args.file)
    except OSError as err:
        raise InvalidInput(f"cannot read {args.file}: {err.strerror}") from err
    passphrase = _passphrase(confirm=False) if encrypted else None
    if args.team:
        return _team_import(args, out, store, passphrase)
    progress, done = _stage_bar(out)
    try:
        report = import_kb(store, args.file, name=args.name, passphrase=passphrase, progress=progress)
    finally:
        done()
    kb = report.knowledge_base
    out.emit(report.to_dict(), f"imported {kb['name']} ({kb['id']}, {kb['model']}): "
             f"{plural(report.sources, 'source')}, {plural(report.chunks, 'chunk')}")
    return 0


def cmd_kb_reembed(args, out: Out) -> int:
    from localkb.ingest.reembed import reembed

    progress, done = _stage_bar(out)
    try:
        report = reembed(_store(args), args.kb, args.model, batch_size=args.batch_size,
                         progress=progress)
    finally:
        done()
    out.emit(report.to_dict(), report.summary)
    return 0


# -- parser ------------------------------------------------------------------------
def _reads() -> str:
    """The file types ``add`` and ``sync`` read, for their ``--help``."""
    import textwrap

    from localkb.ingest.documents import readable_suffixes

    listed = textwrap.fill(" ".join(readable_suffixes()), 88, initial_indent="  ", subsequent_indent="  ")
    return f"reads:\n{listed}\n  (anything else is skipped with its type named)"


def build_parser() -> argparse.ArgumentParser:
    reads = _reads()
    p = argparse.ArgumentParser(prog="localkb", description="Personal knowledge bases on your machine.",
                                epilog=f"{INGEST_EXITS}\n(add and sync; other commands exit 0 on success)",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"localkb {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)

    kb = sub.add_parser("kb", help="create, list, update and delete knowledge bases")
    kbs = kb.add_subparsers(dest="kb_command", required=True)
    c = kbs.add_parser("create", parents=[common], help="create a knowledge base")
    c.add_argument("name")
    c.add_argument("--privacy", choices=["device", "cloud"], default="device")
    c.add_argument("--model", default=None, help="embedding model id (default all-MiniLM-L6-v2)")
    c.add_argument("--keyword-engine", choices=["auto", "whoosh", "tantivy"], default=None,
                   help="keyword index engine (default auto: tantivy; whoosh pins Whoosh)")
    c.set_defaults(func=cmd_kb_create)
    c = kbs.add_parser("list", parents=[common], help="list knowledge bases with counts")
    c.set_defaults(func=cmd_kb_list)
    c = kbs.add_parser("update", parents=[common],
                       help="rename, change privacy, or switch the keyword engine")
    c.add_argument("kb")
    c.add_argument("--name")
    c.add_argument("--privacy", choices=["device", "cloud"])
    c.add_argument("--keyword-engine", choices=["auto", "whoosh", "tantivy"],
                   help="switch the keyword engine (its index is rebuilt from the catalogue)")
    c.set_defaults(func=cmd_kb_update)
    c = kbs.add_parser("delete", parents=[common], help="delete a knowledge base and its data")
    c.add_argument("kb")
    c.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    c.set_defaults(func=cmd_kb_delete)
    c = kbs.add_parser("compact", parents=[common],
                       help="merge the vector index's segments now (writes leave it to the background)")
    c.add_argument("kb")
    c.add_argument("--auto", action="store_true",
                   help="quiet, errors to the error log (what a write's detached compaction runs)")
    c.set_defaults(func=cmd_kb_compact)
    c = kbs.add_parser("reembed", parents=[common], help="move a knowledge base to another embedding model")
    c.add_argument("kb")
    c.add_argument("--model", required=True, help="target model id (all-MiniLM-L6-v2, hashing-256)")
    c.add_argument("--batch-size", type=int, default=64, help="passages per embedding batch")
    c.set_defaults(func=cmd_kb_reembed)

    c = sub.add_parser("add", parents=[common], help="add files, folders or URLs to a knowledge base",
                       description="Add files, folders (recursive) and public URLs to a knowledge base.",
                       epilog=f"{reads}\n\n{INGEST_EXITS}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("kb")
    c.add_argument("items", nargs="+", metavar="PATH_OR_URL")
    c.add_argument("--include", action="append", help="glob of files to include (repeatable)")
    c.add_argument("--exclude", action="append", help="glob of files or folders to skip (repeatable)")
    c.add_argument("--max-size", default=None, metavar="SIZE",
                   help="size cap per source, e.g. 500MB (default 200MB; 0 lifts it)")
    c.add_argument("--access", default=None,
                   help="team knowledge bases: the access level of these sources (public, internal, "
                        "confidential, secret; default: the knowledge base's)")
    c.set_defaults(func=cmd_add)
    c = sub.add_parser("sync", parents=[common],
                       help="make a knowledge base match a folder: add new files, re-index changed ones, "
                            "remove deleted ones", epilog=f"{reads}\n\n{INGEST_EXITS}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("kb")
    c.add_argument("folder", nargs="?", default=None,
                   help="the folder (remembered with its rules; omit it to sync the remembered one)")
    c.add_argument("--include", action="append", help="glob of files to include (repeatable; remembered)")
    c.add_argument("--exclude", action="append",
                   help="glob of files or folders to skip (repeatable; remembered)")
    c.add_argument("--max-size", default=None, metavar="SIZE", help="size cap per source (0 lifts it)")
    c.add_argument("--watch", action="store_true", help="keep syncing as files change (Ctrl-C stops)")
    c.add_argument("--prune", action="store_true",
                   help="remove the sources of folders this knowledge base synced before and no longer "
                        "does (without it they are reported and kept)")
    c.set_defaults(func=cmd_sync)
    c = sub.add_parser("sources", parents=[common], help="list the sources of a knowledge base")
    c.add_argument("kb")
    c.add_argument("--limit", type=int, default=None, help="how many (100; with --json all of them)")
    c.add_argument("--offset", type=int, default=0)
    c.add_argument("--sort", choices=["title", "added", "updated"], default="title")
    c.set_defaults(func=cmd_sources)
    c = sub.add_parser("remove", parents=[common], help="remove a source and its chunks")
    c.add_argument("kb")
    c.add_argument("source", help="the source's id, title, file name, URL or path")
    c.set_defaults(func=cmd_remove)

    c = sub.add_parser("search", parents=[common], help="hybrid search with per-knowledge-base status")
    c.add_argument("kb", nargs="+", metavar="KB", help="one or more knowledge bases (names or ids)")
    c.add_argument("query", metavar="QUERY", help="what to search for")
    c.add_argument("-k", type=int, default=5)
    c.add_argument("--mode", choices=["hybrid", "vector", "keyword"], default="hybrid")
    c.add_argument("--cutoff", type=float, default=None, help="relevance floor on cosine (0.35)")
    c.add_argument("--explain", action="store_true", help="print the score table with the cut-off")
    c.add_argument("--per-source", type=int, default=None, metavar="N",
                   help="at most N passages from any one source (1: which pages say this)")
    c.add_argument("--rerank-model", default=None, help="cross-encoder ONNX file to rerank the top 50")
    c.set_defaults(func=cmd_search)

    c = sub.add_parser("errors", parents=[common], help="the error log")
    c.add_argument("--source", help="ingest, rag-retrieval, index, host, chat ...")
    c.add_argument("--kb")
    c.add_argument("--limit", type=int, default=10)
    c.add_argument("--offset", type=int, default=0)
    c.set_defaults(func=cmd_errors)
    c = sub.add_parser("doctor", parents=[common], help="check (and --repair) the store and model")
    c.add_argument("--repair", action="store_true")
    c.set_defaults(func=cmd_doctor)
    c = sub.add_parser("eval", parents=[common], help="retrieval eval on a BEIR-layout folder")
    c.add_argument("path")
    c.add_argument("--modes", nargs="+", default=["vector", "keyword", "hybrid"])
    c.add_argument("--model", default=None)
    c.add_argument("-k", type=int, default=10)
    c.add_argument("--rerank-model", default=None)
    c.add_argument("--limit-queries", type=int, default=None)
    c.add_argument("--keyword-engine", choices=["auto", "whoosh", "tantivy"], nargs="+", default=None,
                   help="keyword engine of the eval's knowledge base (default: as kb create); "
                        "several: each scored on the same passages and vectors, paired")
    c.add_argument("--store", choices=["local", "team"], default="local",
                   help="team: the same eval on the PostgreSQL + pgvector store (a throw-away database)")
    c.add_argument("--db", default=None, help="with --store team: a PostgreSQL URL (default: an embedded "
                                              "cluster in a temporary folder)")
    c.add_argument("--baseline", choices=["bm25"], default=None,
                   help="also score plain BM25 over whole pages (rank-bm25, \\w+ tokens)")
    c.add_argument("--split", default="test", help="the qrels file to score (qrels/SPLIT.tsv)")
    c.add_argument("--index-dir", default=None,
                   help="keep the index there; a later run on the same set reuses it")
    c.set_defaults(func=cmd_eval)
    c = sub.add_parser("log", parents=[common], help="the query log")
    c.add_argument("--limit", type=int, default=20)
    c.add_argument("--offset", type=int, default=0)
    c.set_defaults(func=cmd_log)
    model = sub.add_parser("model", help="the embedding model")
    models = model.add_subparsers(dest="model_command", required=True)
    c = models.add_parser("build", parents=[common],
                          help="build and verify our int8 MiniLM from the shipped weights, "
                               "then pick the fastest")
    c.add_argument("--force", action="store_true", help="rebuild even if a verified build exists")
    c.set_defaults(func=cmd_model_build)

    browsers = ["chrome", "chromium", "brave", "edge", "firefox", "all"]
    c = sub.add_parser("install", parents=[common], help="register the native-messaging host with browsers")
    c.add_argument("--browser", action="append", choices=browsers,
                   help="browser to register with (repeatable; default: every browser found)")
    c.add_argument("--check", action="store_true", help="explain what is registered and test the launcher")
    c.set_defaults(func=cmd_install)
    c = sub.add_parser("uninstall", parents=[common], help="remove the host registration")
    c.add_argument("--browser", action="append", choices=browsers)
    c.set_defaults(func=cmd_uninstall)
    for name, helptext in (("ask", "answer a question from knowledge bases, with citations"),
                           ("chat", "a conversation over knowledge bases (one message a line)")):
        c = sub.add_parser(name, parents=[common], help=helptext)
        c.add_argument("kb", nargs="+", metavar="KB", help="one or more knowledge bases")
        if name == "ask":
            c.add_argument("question", metavar="QUESTION", help="the question")
        c.add_argument("--endpoint", default=None, help="model endpoint name (default: the default one)")
        c.add_argument("--extractive", action="store_true", help="no model: quote the best passages")
        c.add_argument("--strict", action="store_true",
                       help="fail instead of skipping a device-only knowledge base for a cloud model")
        c.add_argument("--weaker", action="store_true", help="include weaker matches in the answer")
        c.set_defaults(func=cmd_ask if name == "ask" else cmd_chat)
    cfg = sub.add_parser("config", help="model endpoints")
    cfgs = cfg.add_subparsers(dest="config_command", required=True)
    ep = cfgs.add_parser("endpoint", help="add, remove, list model endpoints; choose the default")
    eps = ep.add_subparsers(dest="action", required=True)
    c = eps.add_parser("add", parents=[common], help="add or replace an OpenAI-compatible endpoint")
    c.add_argument("name")
    c.add_argument("base_url", help="API root, e.g. http://127.0.0.1:11434/v1")
    c.add_argument("model")
    c.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    c.add_argument("--api-key-stdin", action="store_true", help="read the API key from stdin (stored 0600)")
    c.add_argument("--mark-cloud", action="store_true",
                   help="a loopback proxy that forwards to a cloud model (treated as cloud)")
    c.add_argument("--default", action="store_true", help="make it the default endpoint")
    c.set_defaults(func=cmd_config_endpoint)
    c = eps.add_parser("remove", parents=[common], help="remove an endpoint")
    c.add_argument("name")
    c.set_defaults(func=cmd_config_endpoint)
    c = eps.add_parser("default", parents=[common], help="set the default endpoint (none: extractive)")
    c.add_argument("name", nargs="?", default=None)
    c.set_defaults(func=cmd_config_endpoint)
    c = eps.add_parser("list", parents=[common], help="list endpoints and where each one runs")
    c.set_defaults(func=cmd_config_endpoint)
    c = sub.add_parser("export", parents=[common], help="export a knowledge base as an .awkb file")
    c.add_argument("kb")
    c.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write (- for stdout)")
    c.add_argument("--encrypt", action="store_true",
                   help="encrypt with a passphrase (prompted, or LOCALKB_PASSPHRASE)")
    c.set_defaults(func=cmd_export)
    c = sub.add_parser("import", parents=[common], help="import an .awkb file as a new knowledge base")
    c.add_argument("file")
    c.add_argument("--name", help="name of the new knowledge base (default: the one in the file, "
                   "made unique)")
    c.add_argument("--team", default=None, help="import into this attached team's server instead "
                                                "(team administrators)")
    c.add_argument("--access", default=None, help="with --team: the access level of every source")
    c.set_defaults(func=cmd_import)
    from localkb.team.cli import add_parser as add_team_parser

    add_team_parser(sub, common)
    c = sub.add_parser("host", help="run as the browser's native-messaging host (stdio)")
    # Browsers pass the caller's origin (Chrome) or the manifest path and extension id (Firefox).
    c.add_argument("browser_args", nargs=argparse.REMAINDER)
    c.set_defaults(func=cmd_host)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from localkb.perms import private_umask

    private_umask()  # the data dir and everything in it: 0700 / 0600, whatever the umask
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Out(getattr(args, "json", False))
    if args.command != "host":  # the host sets up its own log
        _log_to_file()
    try:
        try:
            return args.func(args, out)
        finally:
            _compact_after()
    except LocalKBError as err:
        if out.json:
            print(json.dumps({"error": err.to_dict()}, indent=2))
        else:
            print(f"localkb: {err.code}: {err}", file=sys.stderr)
        return EXIT_CODES.get(err.code, 1)
    except KeyboardInterrupt:
        print("\ninterrupted at once; what was written before stays (run the same command to finish)",
              file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (| head): stop quietly. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _log_to_file() -> None:
    """Library warnings (a PDF's "EOF marker not found") go to <data dir>/logs/cli.log, not the terminal."""
    import logging
    import logging.handlers

    root = logging.getLogger()
    if any(getattr(h, "_localkb", False) for h in root.handlers):
        return
    try:
        folder = Settings.from_env().data_dir / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            folder / "cli.log", maxBytes=2_000_000, backupCount=2, encoding="utf-8")
    except (OSError, ValueError):
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler._localkb = True
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())

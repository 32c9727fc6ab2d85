"""The native-messaging handlers: validate ``data``, call the core, return a result dict.

Thin by design (the CLI's twin): no retrieval or storage logic lives here.
Heavy modules are imported inside the handlers so ``status`` answers from a
cold start before the model or the indexes are touched.
"""

from __future__ import annotations

import base64
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from localkb import PROTOCOL_VERSION, __version__
from localkb.config import Settings
from localkb.errors import InvalidInput, LocalKBError
from localkb.inputs import MAX_TEXT, b64_bytes, req_bool, req_int, req_kbs, req_str
from localkb.strings import KB_NAME_MAX

_store = None
_store_lock = threading.Lock()


def get_store():
    """The process-wide store (opened on first use, so the model and indexes load once)."""
    global _store  # noqa: PLW0603 - one store per host process, created lazily
    with _store_lock:
        if _store is None:
            from localkb.store.kb import Store

            _store = Store(Settings.from_env())
            if _store.settings.compact != "off":
                from localkb.store.compaction import BackgroundCompaction

                # A write that leaves compaction due starts it on its own thread ("inline"
                # waits for it here, in the writer's thread).
                background = BackgroundCompaction(_store)
                _store.on_compaction_due = (background.request if _store.settings.compact == "background"
                                            else background.run)
        return _store


def get_library():
    """The local store plus the attached team servers' knowledge bases (``team.attached``)."""
    from localkb.team.attached import Library

    return Library(get_store())


def reset_store() -> None:
    """Forget the process-wide store (tests that change LOCALKB_HOME)."""
    global _store  # noqa: PLW0603
    with _store_lock:
        if _store is not None:
            _store.close()
        _store = None


# -- handlers ----------------------------------------------------------------------
def h_status(data: dict, ctx) -> dict:
    """Always answers: version, model state, data dir, per-knowledge-base counts and health."""
    # Limits the extension's fields enforce as they are typed (no import: status answers cold).
    out: dict[str, Any] = {"host_version": __version__, "protocol_version": PROTOCOL_VERSION,
                           "limits": {"kb_name": KB_NAME_MAX}}
    try:
        settings = Settings.from_env()
        out["data_dir"] = str(settings.data_dir)
        from localkb.store.catalog import Catalog

        catalog = _store.catalog if _store is not None else Catalog(settings.data_dir / "catalog.sqlite")
        from localkb.store.listing import index_summary

        kbs = []
        for rec in catalog.kbs():
            summary = index_summary(settings.data_dir / "kbs" / rec.id, rec)
            kbs.append({**rec.public(), **catalog.counts(rec.id),
                        "index_health": summary["health"], "segments": summary["segments"]})
        from localkb.team.attached import load_attachments

        # Attached teams from their last listing: status never waits on the network.
        for team in load_attachments(settings.data_dir):
            kbs += [{**k, "origin": "team", "team": team.name, "index_health": "on the team server"}
                    for k in team.kbs]
        out["knowledge_bases"] = kbs
        out["model"] = _model_state(settings)
        out["endpoint"] = _endpoint_state(settings)
        out["ready"] = True
    except Exception as err:
        out["ready"] = False
        out["problem"] = f"{type(err).__name__}: {err}"
    return out


def _model_state(settings: Settings) -> dict:
    embed = sys.modules.get("localkb.embedding.embedder")  # not imported yet: nothing can be loaded
    for (model_id, *_rest), emb in list(embed._SHARED.items() if embed else ()):
        if model_id == settings.default_model:
            info = emb.describe()
            if getattr(emb, "load_error", None):
                info["error"] = emb.load_error
            return info
    return {"id": settings.default_model, "loaded": False,
            "reason": "not loaded yet: it loads on the first save or search"}


def _endpoint_state(settings: Settings) -> dict | None:
    if "localkb.answer.llm" not in sys.modules:
        # Importing the HTTP client costs more than the cold-start budget allows; the
        # extension asks config.get for endpoints and their location.
        from localkb.atomic import read_json

        raw = read_json(settings.data_dir / "config.json") or {}
        name = raw.get("default_endpoint")
        return {"name": name, "location": None} if name else None
    try:
        from localkb.answer.llm import load_config

        cfg = load_config(settings.data_dir)
    except LocalKBError as err:
        return {"error": str(err)}
    return cfg.default.public_dict() if cfg.default else None


def h_kb_list(data: dict, ctx) -> dict:
    """Local knowledge bases, then those of attached teams (``origin: "team"``, ``team``: its name)."""
    library = get_library()
    teams = library.refresh()
    out = [{**r.public(), **library.counts(r.id), "origin": "local"} for r in library.local.kbs()]
    down = {t["team"]: t["error"] for t in teams if not t["ok"]}
    for r in library.team_records():
        entry = {**r.public(), **library.counts(r.id)}
        if r.team in down:
            entry["unavailable"] = down[r.team]
        out.append(entry)
    return {"knowledge_bases": out, "teams": teams}


def h_kb_create(data: dict, ctx) -> dict:
    rec = get_store().create_kb(req_str(data, "name", max_len=80),
                                privacy=req_str(data, "privacy", required=False) or "device",
                                model=req_str(data, "model", required=False, max_len=100))
    return {"knowledge_base": {**rec.public(), "sources": 0, "chunks": 0}}


def h_kb_update(data: dict, ctx) -> dict:
    store = get_store()
    rec = store.update_kb(req_str(data, "kb", max_len=200),
                          name=req_str(data, "name", required=False, max_len=80),
                          privacy=req_str(data, "privacy", required=False))
    return {"knowledge_base": {**rec.public(), **store.catalog.counts(rec.id)}}


def h_kb_delete(data: dict, ctx) -> dict:
    rec = get_store().delete_kb(req_str(data, "kb", max_len=200))
    return {"deleted": rec.id, "name": rec.name}


def h_source_add(data: dict, ctx) -> dict:
    """Save a captured page; streams ``progress`` events, ends with the honest report."""
    from localkb.ingest.pipeline import add_capture

    url = req_str(data, "url", required=False, max_len=8192)
    title = req_str(data, "title", required=False, max_len=2000, allow_empty=True)
    html = req_str(data, "html", required=False, max_len=MAX_TEXT)
    text = req_str(data, "text", required=False, max_len=MAX_TEXT)
    pdf = b64_bytes(data, "pdf_base64")
    captured_by = req_str(data, "captured_by", required=False, max_len=40) or "api"
    kb = get_library().open_kb(req_str(data, "kb", max_len=200))
    if getattr(kb, "remote", False):  # a team knowledge base: its server extracts, embeds, writes
        return kb.add_capture(url=url, title=title, html=html, text=text, captured_by=captured_by,
                              pdf_base64=data.get("pdf_base64") if pdf is not None else None,
                              canonical_url=req_str(data, "canonical_url", required=False, max_len=8192),
                              lang=req_str(data, "lang", required=False, max_len=35),
                              access=req_str(data, "access", required=False, max_len=20))

    def progress(ev: dict) -> None:
        ctx.emit("progress", {k: v for k, v in ev.items() if k != "source"})

    report = add_capture(kb, url=url, title=title, html=html, text=text, pdf=pdf,
                         captured_by=captured_by,
                         canonical_url=req_str(data, "canonical_url", required=False, max_len=8192),
                         lang=req_str(data, "lang", required=False, max_len=35),
                         progress=progress, check_cancelled=ctx.check_cancelled)
    return {**report.to_dict(), "kb": kb.id, "kb_name": kb.record.name}


def h_kb_sync(data: dict, ctx) -> dict:
    """Sync a knowledge base with the folder remembered for it (set by ``localkb sync KB FOLDER``).

    Requests carry no paths: the folder and its rules come from the knowledge base's settings.
    Streams ``progress`` events; ends with the sync report. A ``cancel`` stops it at the next
    safe point (what was written stays) and answers ``cancelled`` with what was kept.
    """
    from localkb.errors import Cancelled
    from localkb.ingest.sync import sync_folder

    kb = get_store().open_kb(req_str(data, "kb", max_len=200))
    report = sync_folder(kb, None, progress=lambda ev: ctx.emit("progress", ev),
                         check_cancelled=ctx.check_cancelled)
    out = {**report.to_dict(), "kb": kb.id, "kb_name": kb.record.name}
    if report.interrupted:
        raise Cancelled(report.kept_line or "cancelled",
                        detail={"kept": out["totals"]["files_seen"] - out["totals"]["pending"],
                                "pending": out["totals"]["pending"], "summary": out["summary"]})
    return out


def h_source_list(data: dict, ctx) -> dict:
    from localkb.ingest.pipeline import list_sources

    kb = get_library().open_kb(req_str(data, "kb", max_len=200))
    sort = req_str(data, "sort", required=False, max_len=20) or "added"
    offset, limit = req_int(data, "offset", 0, lo=0, hi=10**9), req_int(data, "limit", 100, lo=1, hi=10_000)
    if getattr(kb, "remote", False):  # a team knowledge base: the sources you may see, oldest first
        rows, total = kb.list_sources(offset=offset, limit=limit)
    else:
        rows, total = list_sources(kb, offset=offset, limit=limit, sort=sort)
    return {"sources": rows, "total": total}


def h_source_remove(data: dict, ctx) -> dict:
    from localkb.ingest.pipeline import remove_source

    kb = get_library().open_kb(req_str(data, "kb", max_len=200))
    ref = req_str(data, "source", max_len=8192)
    return kb.remove_source(ref) if getattr(kb, "remote", False) else remove_source(kb, ref)


def h_search(data: dict, ctx) -> dict:
    from localkb.retrieval.search import Searcher

    cutoff = data.get("cutoff")
    if cutoff is not None and (isinstance(cutoff, bool) or not isinstance(cutoff, int | float)
                               or not -1.0 <= cutoff <= 1.0):
        raise InvalidInput("'cutoff' must be a number from -1 to 1 (a cosine)",
                           detail={"field": "cutoff"})
    store = get_library()
    kbs = req_kbs(data)
    if any(k.startswith("page_") for k in kbs):  # the open page ("Test this search in This page")
        from localkb.store.pagekb import WithPages

        store = WithPages(store, _page_shelf())
    res = Searcher(store).search(
        kbs, req_str(data, "query", max_len=4000), k=req_int(data, "k", 8, lo=1, hi=100),
        mode=req_str(data, "mode", required=False) or "hybrid", cutoff=cutoff,
        per_source=req_int(data, "per_source", 0, lo=0, hi=100) or None)
    out = res.to_dict()
    if req_bool(data, "include_weaker"):
        out["hits"] = out["hits"] + out["weaker"]
    return out


def h_errors_list(data: dict, ctx) -> dict:
    store = get_store()
    kb = req_str(data, "kb", required=False, max_len=200)
    rows, total = store.catalog.errors(
        source=req_str(data, "source", required=False, max_len=40),
        kb_id=store.resolve(kb).id if kb else None,
        offset=req_int(data, "offset", 0, lo=0, hi=10**9), limit=req_int(data, "limit", 20, lo=1, hi=200))
    return {"errors": rows, "total": total}


def h_config_get(data: dict, ctx) -> dict:
    from localkb.answer.llm import load_config

    return load_config(get_store().root).public_dict()


def h_config_check(data: dict, ctx) -> dict:
    """How the host reads one endpoint before it is saved: ``{endpoint}`` -> its public form.

    The options page shows this ``location`` beside a row being edited, so the label is the
    privacy gate's own verdict, never a rule of the page's.
    """
    from localkb.answer.llm import Endpoint

    given = data.get("endpoint")
    if not isinstance(given, dict):
        raise InvalidInput("'endpoint' must be an object", detail={"field": "endpoint"})
    # Name and model are not what is being checked: a row still being typed may lack them.
    raw = {**given, "name": given.get("name") or "check", "model": given.get("model") or "check",
           "api_key": None}
    public = Endpoint.from_dict(raw).public_dict()
    public.pop("api_key_set", None)  # no key was looked at
    return {"endpoint": public}


def h_config_set(data: dict, ctx) -> dict:
    """Replace the endpoint list; an endpoint without ``api_key`` keeps its stored key only while
    its base URL is unchanged (``notes`` says when a key was dropped)."""
    from localkb.answer.llm import LLMConfig, load_config, merge_endpoint, save_config

    root = get_store().root
    old = load_config(root)
    endpoints = data.get("endpoints", [])
    if not isinstance(endpoints, list) or len(endpoints) > 50:
        raise InvalidInput("'endpoints' must be a list", detail={"field": "endpoints"})
    parsed, notes = [], []
    for given in endpoints:
        endpoint, note = merge_endpoint(old, given)
        parsed.append(endpoint)
        if note:
            notes.append(note)
    default = req_str(data, "default_endpoint", required=False, max_len=100)
    cfg = LLMConfig(endpoints=tuple(parsed), default_endpoint=default)
    save_config(root, cfg)
    return {**cfg.public_dict(), "notes": notes}


# -- chat --------------------------------------------------------------------------
_chat_state: dict[str, Any] = {}


def _chat_shared():
    """The process-wide answer cache and pending confirmations (created on first chat)."""
    with _store_lock:
        if not _chat_state:
            from localkb.answer.chat import AnswerCache, Confirmations

            _chat_state.update(cache=AnswerCache(), confirmations=Confirmations())
        return _chat_state["cache"], _chat_state["confirmations"]


def h_chat(data: dict, ctx) -> dict:
    """One grounded chat turn: ``step`` and ``token`` events (``confirm`` for a write), then the answer."""
    from localkb.answer.chat import ChatOptions, parse_continuation, parse_history, run_turn
    from localkb.answer.llm import load_config

    store = get_library()
    page_id = req_str(data, "page", required=False, max_len=100)
    # With the open page, the knowledge bases beside it are optional.
    kbs = req_kbs(data) if page_id is None or data.get("kbs") or data.get("kb") else []
    message = req_str(data, "message", max_len=8000)
    page = None
    if page_id is not None:
        from localkb.answer.pagechat import mark_progress, mark_result, page_view, summarize

        page = _page_shelf().require(page_id)
        store = page_view(store, _page_shelf(), page_id, to_cloud=req_bool(data, "page_to_cloud"))
        kbs = [*kbs, page_id]
    history = parse_history(data.get("history"))
    name = req_str(data, "endpoint", required=False, max_len=100)
    extractive = req_bool(data, "extractive")
    config = load_config(store.local.root)
    endpoint = None if extractive else (config.get(name) if name else config.default)
    # true: every knowledge base's weaker matches; a list: those of the knowledge bases named.
    weaker = data.get("use_weaker_matches", False)
    if isinstance(weaker, list):
        weaker_kbs = tuple(req_kbs({"kbs": weaker}))
        weaker = False
    else:
        weaker_kbs = ()
        weaker = req_bool(data, "use_weaker_matches")
    if page is not None and req_bool(data, "summarize"):
        with page.in_use():
            return summarize(store, page, endpoint, on_token=lambda t: ctx.emit("token", {"text": t}),
                             cancel=ctx.cancelled).to_dict()
    # A stopped answer to continue is an assistant turn like any in the history.
    continued = parse_continuation(data)
    options = ChatOptions(k=req_int(data, "k", 8, lo=1, hi=50), use_weaker_matches=weaker,
                          weaker_kbs=weaker_kbs, strict=req_bool(data, "strict"), kind="chat",
                          no_model_reason="you chose no model" if extractive
                          else "no model is configured",
                          continue_from=continued.content if continued is not None else "",
                          continue_kbs=continued.kbs if continued is not None else None)
    from localkb.team.relay import relay_turn, team_of_turn

    # Every knowledge base on one team, no model chosen here: the team server answers
    # (its model, caches, caps, guardrails, query log) and its stream is relayed as it comes.
    # What it is handed passes the privacy gate first (``relay_turn``).
    team = None if extractive or name else team_of_turn(store, kbs)
    if team is not None:
        emitted: list[str] = []

        def relayed(event: str, payload: dict) -> None:
            emitted.append(event)
            ctx.emit(event, payload)

        try:
            return relay_turn(store, team, kbs, message, history=history, options=options,
                              regenerate=req_bool(data, "regenerate"), emit=relayed,
                              cancel=ctx.cancelled)
        except LocalKBError as err:
            # A server without team chat (an older one: no such endpoint) or one that cannot
            # be reached before anything was relayed: answered here instead, where an
            # unreachable team is an ``unavailable`` step, never "nothing found".
            if emitted or err.code not in ("not_found", "team_unavailable"):
                raise
    cache, confirmations = _chat_shared()
    timeout = store.settings.confirm_timeout_s

    def confirm(request: dict) -> bool | None:
        # Registered before the event goes out, so an instant chat.confirm is never lost.
        confirmations.open(ctx.id, request["call_id"])
        ctx.emit("confirm", {**request, "expires_in_s": timeout})
        return confirmations.wait(ctx.id, request["call_id"], ctx.cancelled, timeout=timeout)

    # "Regenerate" asks for a new answer: the cached one is neither read nor replaced.
    # An open page's background embedding waits while the turn searches it (``in_use``).
    with page.in_use() if page else contextlib.nullcontext():
        result = run_turn(store, kbs, message, history=history, endpoint=endpoint, options=options,
                          cache=None if req_bool(data, "regenerate") else cache,
                          on_step=lambda s: ctx.emit("step", mark_progress(s, page) if page else s),
                          on_token=lambda t: ctx.emit("token", {"text": t}), confirm=confirm,
                          cancel=ctx.cancelled,
                          on_provenance=lambda kbs: ctx.emit("provenance", {"kbs": kbs}))
    return (mark_result(result, page) if page else result).to_dict()


def h_chat_confirm(data: dict, ctx) -> dict:
    """The user's answer to a ``confirm`` event of the running ``chat`` request ``target``."""
    target = data.get("target")
    if isinstance(target, bool) or not isinstance(target, str | int):
        raise InvalidInput("'target' must be the id of the chat request", detail={"field": "target"})
    call_id = req_str(data, "call_id", max_len=200)
    approve = data.get("approve")
    if not isinstance(approve, bool):
        raise InvalidInput("'approve' must be true or false", detail={"field": "approve"})
    _, confirmations = _chat_shared()
    return {"delivered": confirmations.answer(target, call_id, approve)}


# -- the open page (chat with a page without saving it) -------------------------------
_pages = None


def _page_shelf():
    """The pages this host process holds in memory (``store.pagekb``), created on first use."""
    global _pages  # noqa: PLW0603 - one shelf per host process: pages live as long as it does
    with _store_lock:
        if _pages is None:
            from localkb.store.pagekb import PageShelf

            _pages = PageShelf()
        return _pages


def h_page_open(data: dict, ctx) -> dict:
    """Hold the open tab in memory, never on disk: its first part searchable, the rest in the background."""
    page = _page_shelf().open(
        get_store(), url=req_str(data, "url", required=False, max_len=8192),
        title=req_str(data, "title", required=False, max_len=2000, allow_empty=True),
        html=req_str(data, "html", required=False, max_len=MAX_TEXT),
        text=req_str(data, "text", required=False, max_len=MAX_TEXT), pdf=b64_bytes(data, "pdf_base64"))
    return page.status()


def h_page_status(data: dict, ctx) -> dict:
    """How much of a held page is searchable (``page_not_held`` once the host let it go)."""
    return _page_shelf().require(req_str(data, "page", max_len=100)).status()


def h_page_close(data: dict, ctx) -> dict:
    """Let a page go (the panel's close button); its passages leave memory."""
    return {"closed": _page_shelf().close(req_str(data, "page", max_len=100))}


# -- portable knowledge bases and re-embedding ----------------------------------------
MAX_UPLOAD_PART = 32 * 1024 * 1024  # decoded bytes per kb.import part; frames are capped at 64 MiB
_uploads = None


def _get_uploads():
    """The process-wide upload area (temporary files in the data dir, dropped at exit)."""
    global _uploads  # noqa: PLW0603 - one upload area per host process
    with _store_lock:
        if _uploads is None:
            from localkb.portable.archive import Uploads

            _uploads = Uploads(Settings.from_env().data_dir)
        return _uploads


def h_kb_export(data: dict, ctx) -> dict:
    """Export a knowledge base as .awkb, encrypted when ``passphrase`` is given.

    Streams ``progress`` events ({stage: "export", done, total}). The result is
    {filename, bytes, sha256, encrypted, model, sources, chunks, data_base64}: the
    whole file as base64. A result of 1 MiB or more travels as numbered ``part``
    events followed by {"parts": n} (see protocol.py); the caller joins the parts'
    text in index order, parses it as JSON to get this result, base64-decodes
    ``data_base64`` and checks its length and sha256 against ``bytes`` and ``sha256``.
    """
    import re
    import tempfile
    from pathlib import Path

    from localkb.portable.archive import SUFFIX, export_to_file

    store = get_store()
    kb = get_library().open_kb(req_str(data, "kb", max_len=200))
    passphrase = req_str(data, "passphrase", required=False, max_len=1024)
    filename = (re.sub(r"[^\w.-]+", "-", kb.record.name).strip("-.") or "knowledge-base") + SUFFIX
    if getattr(kb, "remote", False):
        return _team_export(kb, filename, passphrase)
    with tempfile.TemporaryDirectory(dir=store.root, prefix=".export-") as tmp:
        path = Path(tmp) / filename
        report = export_to_file(kb, path, passphrase=passphrase,
                                progress=lambda ev: ctx.emit("progress", ev),
                                check_cancelled=ctx.check_cancelled)
        raw = path.read_bytes()
    return {"filename": filename, "bytes": report.bytes, "sha256": report.sha256,
            "encrypted": report.encrypted, "model": report.model, "sources": report.sources,
            "chunks": report.chunks, "data_base64": base64.b64encode(raw).decode("ascii")}


def _team_export(kb, filename: str, passphrase: str | None) -> dict:
    """A team knowledge base's .awkb (what this user may see), sealed here when a passphrase is given."""
    import hashlib
    import io

    from localkb.portable import envelope

    raw, headers = kb.export()
    encrypted = False
    if passphrase:
        out = io.BytesIO()
        envelope.seal(io.BytesIO(raw), out, passphrase)
        raw, encrypted = out.getvalue(), True
    return {"filename": filename, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
            "encrypted": encrypted, "model": headers.get("x-localkb-model"),
            "sources": int(headers.get("x-localkb-sources", 0)),
            "chunks": int(headers.get("x-localkb-chunks", 0)), "origin": "team", "team": kb.team.name,
            "data_base64": base64.b64encode(raw).decode("ascii")}


def h_kb_import(data: dict, ctx) -> dict:
    """Import an .awkb file sent in parts, as a new knowledge base.

    {action: "begin"} -> {upload, max_bytes}; {action: "part", upload, index (0, 1, ...),
    data_base64} -> {upload, parts, bytes}; {action: "commit", upload, name?, passphrase?}
    -> {knowledge_base, sources, chunks, model, name_in_file}; {action: "abort", upload}
    -> {aborted}. A commit drops the upload, except when it fails with
    ``passphrase_required`` or ``decryption_failed``: then the same upload may be
    committed again with a passphrase (or aborted). Uploads also go when the host exits.
    """
    from localkb.errors import DecryptionFailed
    from localkb.portable.archive import import_kb

    uploads = _get_uploads()
    action = req_str(data, "action", max_len=20)
    if action == "begin":
        return {"upload": uploads.begin(), "max_bytes": uploads.max_bytes}
    upload = req_str(data, "upload", max_len=100)
    if action == "part":
        raw = b64_bytes(data, "data_base64", max_bytes=MAX_UPLOAD_PART)
        if raw is None:
            raise InvalidInput("'data_base64' is required", detail={"field": "data_base64"})
        return uploads.part(upload, req_int(data, "index", 0, lo=0, hi=10**7), raw)
    if action == "abort":
        return {"aborted": uploads.drop(upload)}
    if action != "commit":
        raise InvalidInput("'action' must be begin, part, commit or abort", detail={"field": "action"})
    path = uploads.take(upload)
    keep = False
    try:
        report = import_kb(get_store(), path, name=req_str(data, "name", required=False, max_len=80),
                           passphrase=req_str(data, "passphrase", required=False, max_len=1024),
                           progress=lambda ev: ctx.emit("progress", ev),
                           check_cancelled=ctx.check_cancelled)
    except DecryptionFailed:
        keep = True
        raise
    finally:
        if not keep:
            uploads.drop(upload)
    return report.to_dict()


def h_kb_reembed(data: dict, ctx) -> dict:
    """Move a knowledge base ({kb, model, batch_size?}) to another embedding model; streams ``progress``.

    Stages: embed (batches, writers not blocked), catch-up (what changed meanwhile),
    switch (one transaction), index (the new model's vector index is built).
    """
    from localkb.ingest.reembed import reembed

    report = reembed(get_store(), req_str(data, "kb", max_len=200), req_str(data, "model", max_len=100),
                     batch_size=req_int(data, "batch_size", 64, lo=1, hi=1024),
                     progress=lambda ev: ctx.emit("progress", ev), check_cancelled=ctx.check_cancelled)
    return report.to_dict()


Handler = Callable[[dict, Any], dict]

HANDLERS: dict[str, Handler] = {
    "status": h_status,
    "kb.list": h_kb_list,
    "kb.create": h_kb_create,
    "kb.update": h_kb_update,
    "kb.delete": h_kb_delete,
    "source.add": h_source_add,
    "kb.sync": h_kb_sync,
    "source.list": h_source_list,
    "source.remove": h_source_remove,
    "search": h_search,
    "errors.list": h_errors_list,
    "config.get": h_config_get,
    "config.set": h_config_set,
    "config.check": h_config_check,
    "chat": h_chat,
    "chat.confirm": h_chat_confirm,
    "page.open": h_page_open,
    "page.status": h_page_status,
    "page.close": h_page_close,
    "kb.export": h_kb_export,
    "kb.import": h_kb_import,
    "kb.reembed": h_kb_reembed,
}

"""Team knowledge bases beside local ones: ``localkb team attach URL --token-stdin``.

An attachment (``<data dir>/teams.json``, mode 0600: the token is a secret) names a team
server, its URL, the user's token, and the last listing of the knowledge bases that
user is granted. ``Library`` is what the CLI and the host search, ask and chat through:
the local store plus every attached team, each team knowledge base marked
``origin: "team"`` with its team's name. A team knowledge base's privacy is the one its
team admin set, and the privacy gate reads it like any other.

A team knowledge base is searched by its server (the same ``Searcher`` runs there, over
PostgreSQL, with the user's access): ``RemoteKB.search`` hands back the server's status
and hits. A server that cannot be reached makes that knowledge base ``unavailable`` —
never ``empty``, never "nothing found" — and the last listing keeps it visible.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localkb.atomic import read_json, write_json
from localkb.errors import Forbidden, InvalidInput, KnowledgeBaseNotFound, LocalKBError, NotFound
from localkb.store.base import KnowledgeStore
from localkb.store.catalog import KBRecord

if TYPE_CHECKING:  # the host's cold-start ``status`` reads attachments without numpy or httpx
    from localkb.store.kb import Store
    from localkb.team.client import TeamClient

TEAMS_FILE = "teams.json"
# One writer of teams.json at a time in this process (the host answers kb.list on several threads).
_SAVE_LOCK = threading.Lock()
_TEAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


@dataclass(frozen=True)
class TeamRecord(KBRecord):
    """A team knowledge base as the attached user sees it."""

    team: str = ""
    access: dict = field(default_factory=dict)
    sources: int = 0
    chunks: int = 0

    def public(self) -> dict:
        return {**super().public(), "origin": "team", "team": self.team, "access": self.access}


def _record(team: str, d: dict) -> TeamRecord:
    return TeamRecord(d["id"], d["name"], d["privacy"], d["model"], d["dim"], d["created"],
                      d["generation"], team=team, access=d.get("access") or {},
                      sources=d.get("sources", 0), chunks=d.get("chunks", 0))


@dataclass
class Attachment:
    name: str
    url: str
    token: str
    kbs: list[dict] = field(default_factory=list)
    attached_at: float = 0.0
    listed_at: float = 0.0

    def client(self, *, quick: bool = False) -> TeamClient:
        """``quick``: for listings (the side panel waits on them): a few seconds, not minutes."""
        import httpx

        from localkb.team.client import TeamClient

        timeout = httpx.Timeout(10.0, connect=3.0) if quick else None
        return TeamClient(self.url, self.token, name=self.name, **({"timeout": timeout} if quick else {}))

    def public(self) -> dict:
        return {"name": self.name, "url": self.url, "attached_at": self.attached_at,
                "listed_at": self.listed_at, "knowledge_bases": len(self.kbs)}


def load_attachments(data_dir: Path) -> list[Attachment]:
    raw = read_json(Path(data_dir) / TEAMS_FILE) or {}
    out = []
    for t in raw.get("teams", []):
        try:
            out.append(Attachment(t["name"], t["url"], t["token"], list(t.get("kbs", [])),
                                  float(t.get("attached_at", 0)), float(t.get("listed_at", 0))))
        except (KeyError, TypeError, ValueError):
            continue  # a hand-edited entry we cannot read is skipped, not fatal
    return out


def save_attachments(data_dir: Path, teams: list[Attachment]) -> None:
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with _SAVE_LOCK:
        write_json(Path(data_dir) / TEAMS_FILE,
                   {"teams": [{"name": t.name, "url": t.url, "token": t.token, "kbs": t.kbs,
                               "attached_at": t.attached_at, "listed_at": t.listed_at} for t in teams]},
                   mode=0o600)


def attach(data_dir: Path, url: str, token: str, *, name: str | None = None) -> dict:
    """Check the URL and token against the server, then remember them (replacing the same name)."""
    if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
        raise InvalidInput("the team server URL must start with http:// or https://")
    from localkb.team.client import TeamClient

    token = (token or "").strip()
    if not token:
        raise InvalidInput("no token given (pipe it in with --token-stdin)")
    with TeamClient(url, token) as client:
        health = client.health()
        me = client.me()
        kbs = client.kbs()
    name = name or str(health.get("name") or "team")
    if not _TEAM_NAME.match(name):
        raise InvalidInput("a team name is 1-40 letters, digits, '.', '_' or '-'")
    teams = [t for t in load_attachments(data_dir) if t.name.lower() != name.lower()]
    now = time.time()
    teams.append(Attachment(name, url.rstrip("/"), token, kbs, now, now))
    save_attachments(data_dir, teams)
    return {"team": name, "url": url.rstrip("/"), "user": me.get("user"),
            "knowledge_bases": [{**k, "team": name} for k in kbs]}


def detach(data_dir: Path, name: str) -> dict:
    teams = load_attachments(data_dir)
    keep = [t for t in teams if t.name.lower() != name.lower()]
    if len(keep) == len(teams):
        raise NotFound(f"no team named {name!r} is attached")
    save_attachments(data_dir, keep)
    return {"detached": name}


class RemoteKB:
    """A team knowledge base, worked on by its server."""

    remote = True

    def __init__(self, library: Library, team: Attachment, record: TeamRecord) -> None:
        self.library = library
        self.team = team
        self.record = record

    @property
    def id(self) -> str:
        return self.record.id

    def _client(self) -> TeamClient:
        return self.team.client()

    def search(self, query: str, *, k: int, mode: str, cutoff: float, floor: bool,
               per_source: int | None) -> tuple[Any, list, dict]:
        """(status, hits, trace) as the server's Searcher found them for this user."""
        from localkb.retrieval.search import Hit, KBStatus

        t0 = time.perf_counter()
        with self._client() as client:
            res = client.search([self.id], query, k=k, mode=mode, cutoff=cutoff, floor=floor,
                                per_source=per_source)
        try:
            raw = res["statuses"][0]
            status = KBStatus(**{f.name: raw[f.name] for f in fields(KBStatus) if f.name in raw})
            names = {f.name for f in fields(Hit)}
            hits = [Hit(**{n: h[n] for n in names if n in h}) for h in res["hits"] + res["weaker"]]
        except (KeyError, TypeError, IndexError) as err:
            raise LocalKBError(f"the team server {self.team.name} sent a search reply this client "
                               f"cannot read ({err})") from err
        trace = dict(res.get("trace", {}).get("kbs", {}).get(self.id, {}))
        trace["team"] = {"name": self.team.name, "round_trip_ms": round((time.perf_counter() - t0) * 1000, 3)}
        return status, hits, trace

    def add_capture(self, **fields_: Any) -> dict:
        with self._client() as client:
            return client.add(self.id, **fields_)

    def list_sources(self, *, offset: int = 0, limit: int = 100) -> tuple[list[dict], int]:
        with self._client() as client:
            res = client.sources(self.id, offset=offset, limit=limit)
        return res["sources"], res["total"]

    def remove_source(self, ref: str) -> dict:
        with self._client() as client:
            return client.remove(self.id, ref)

    def set_access(self, ref: str, access: str) -> dict:
        with self._client() as client:
            return client.set_access(self.id, ref, access)

    def export(self) -> tuple[bytes, dict]:
        with self._client() as client:
            return client.export(self.id)


class Library(KnowledgeStore):
    """The local store plus the attached teams' knowledge bases, for search, ask and chat."""

    def __init__(self, store: Store) -> None:
        self.local = store
        self.settings = store.settings
        self.models = store.models
        self.teams = load_attachments(store.root)

    # -- listing ----------------------------------------------------------------------------
    def team_records(self) -> list[TeamRecord]:
        return [_record(t.name, k) for t in self.teams for k in t.kbs]

    def refresh(self) -> list[dict]:
        """Ask every attached server for its listing; a server that does not answer keeps its last one.

        Returns one ``{team, ok, error?}`` per team.
        """
        out = []
        changed = False
        for team in self.teams:
            try:
                with team.client(quick=True) as client:
                    fresh = client.kbs()
                team.listed_at = time.time()
                changed = changed or fresh != team.kbs
                team.kbs = fresh
                out.append({"team": team.name, "ok": True})
            except LocalKBError as err:
                out.append({"team": team.name, "ok": False, "error": err.to_dict()})
        if changed:
            save_attachments(self.local.root, self.teams)
        return out

    def confirm_privacy(self) -> None:
        """Before text may go to a model off this machine: each team's privacy settings as they are now.

        The listing in ``teams.json`` may be older than an administrator's change from
        ``cloud`` to ``device``; every team is asked again, and the knowledge bases of a team
        that does not answer count as ``device`` for the rest of this process's view (the
        gate then skips them; it never trusts a stale ``cloud``).
        """
        if not self.teams:
            return
        for team, res in zip(self.teams, self.refresh(), strict=True):
            if not res["ok"]:
                team.kbs = [{**k, "privacy": "device"} for k in team.kbs]

    def kbs(self) -> list[KBRecord]:
        return [*self.local.kbs(), *self.team_records()]

    def _team_of(self, rec: TeamRecord) -> Attachment:
        return next(t for t in self.teams if t.name == rec.team)

    def resolve(self, ref: str) -> KBRecord:
        """Local first (ids, then names); then a team knowledge base by id, ``Team/Name`` or a unique name.

        A name no listing knows yet asks the teams once for a fresh one (granted meanwhile).
        """
        try:
            return self.local.resolve(ref)
        except KnowledgeBaseNotFound:
            pass
        try:
            return self._resolve_team(ref)
        except KnowledgeBaseNotFound:
            if not self.teams:
                raise
        self.refresh()
        return self._resolve_team(ref)

    def _resolve_team(self, ref: str) -> TeamRecord:
        records = self.team_records()
        for rec in records:
            if rec.id == ref:
                return rec
        team, _, name = ref.partition("/") if "/" in ref else (None, "", ref)
        found = [r for r in records if r.name.lower() == name.lower()
                 and (team is None or r.team.lower() == team.lower())]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise InvalidInput(f"{ref!r} names a knowledge base on several teams: say "
                               + " or ".join(f"'{r.team}/{r.name}'" for r in found))
        raise KnowledgeBaseNotFound(f"no knowledge base named or with id {ref!r}")

    def record(self, kb_id: str) -> KBRecord | None:
        rec = self.local.record(kb_id)
        if rec is not None:
            return rec
        return next((r for r in self.team_records() if r.id == kb_id), None)

    def create_kb(self, name: str, *, privacy: str = "device", model: str | None = None) -> KBRecord:
        return self.local.create_kb(name, privacy=privacy, model=model)

    def delete_kb(self, ref: str) -> KBRecord:
        rec = self.resolve(ref)
        if isinstance(rec, TeamRecord):
            raise Forbidden(f"{rec.name!r} belongs to the team {rec.team}: its administrators delete it")
        return self.local.delete_kb(rec.id)

    def open_kb(self, ref: str):
        rec = self.resolve(ref)
        if isinstance(rec, TeamRecord):
            return RemoteKB(self, self._team_of(rec), rec)
        return self.local.open_kb(rec.id)

    def generation(self, kb_id: str) -> int | None:
        rec = self.record(kb_id)
        if not isinstance(rec, TeamRecord):
            return self.local.generation(kb_id)
        try:
            with self._team_of(rec).client(quick=True) as client:
                fresh = {k["id"]: k for k in client.kbs()}
        except LocalKBError:
            return None  # unknown: a cache key with None never matches a fresh one
        return fresh[kb_id]["generation"] if kb_id in fresh else None

    def counts(self, kb_id: str) -> dict:
        rec = self.record(kb_id)
        if isinstance(rec, TeamRecord):
            return {"sources": rec.sources, "chunks": rec.chunks}
        return self.local.counts(kb_id)

    def passage_window(self, kb_id: str, source_id: str, idx: int, radius: int) -> list[dict]:
        rec = self.record(kb_id)
        if isinstance(rec, TeamRecord):
            with self._team_of(rec).client() as client:
                return client.passages(kb_id, source_id, idx, radius)
        return self.local.passage_window(kb_id, source_id, idx, radius)

    def log_error(self, source: str, code: str, message: str, *, kb_id: str | None = None,
                  ref: str | None = None, detail: dict | None = None) -> None:
        local = kb_id if kb_id is not None and self.local.record(kb_id) is not None else None
        self.local.log_error(source, code, message, kb_id=local, ref=ref, detail=detail)

    def log_query(self, kind: str, query: str, kb_ids: list[str], trace: dict) -> None:
        self.local.log_query(kind, query, kb_ids, trace)


#: How a file's suffix is sent to the server (it extracts as the local pipeline does).
_AS_PDF = (".pdf",)
_AS_HTML = (".html", ".htm", ".xhtml")


def upload_items(kb: RemoteKB, items: list[str], *, settings, include=(), exclude=(),
                 access: str | None = None, progress=None) -> dict:
    """Add files, folders and URLs to a team knowledge base: read (or fetch) here, extracted there.

    A file's address is its ``file://`` URL, so adding it again updates the same source.
    Returns the same shape as a local add: per-source reports and totals.
    """
    import base64

    from localkb.ingest.documents import kind_of
    from localkb.ingest.files import walk_folder
    from localkb.ingest.pipeline import IngestReport, SourceReport, fetch_url

    jobs: list[tuple[str, Any]] = []
    failed: list[SourceReport] = []
    for item in items:
        if item.startswith(("http://", "https://")):
            jobs.append((item, None))
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            walk = walk_folder(path, include, exclude, max_bytes=settings.max_source_bytes)
            found = [p for p, _size in walk.files]
            jobs += [(str(p), p) for p in found]
            failed += [SourceReport(str(p), "skipped", reason=why) for p, why in walk.skipped]
            if not found:
                failed.append(SourceReport(item, "failed", error={
                    "code": "invalid_input", "message": "the folder has no files to add"}))
        elif path.is_file():
            jobs.append((str(path), path))
        else:
            failed.append(SourceReport(item, "failed", error={"code": "invalid_input",
                                                              "message": "no such file or folder"}))
    report = IngestReport(sources=failed)
    for n, (name, path) in enumerate(jobs):
        if progress is not None:
            progress({"stage": "upload", "done": n, "total": len(jobs), "source": name})
        try:
            if path is None:
                body, ctype, final = fetch_url(name, max_bytes=settings.fetch_url_max_bytes,
                                               timeout=settings.fetch_timeout_s)
                url = final
                is_pdf, is_html = ctype == "application/pdf", ctype in ("text/html", "application/xhtml+xml")
            else:
                body = path.read_bytes()
                url = path.resolve().as_uri()
                is_pdf, is_html = path.suffix.lower() in _AS_PDF, path.suffix.lower() in _AS_HTML
            fields_: dict[str, Any] = {"url": url, "captured_by": "cli", "access": access}
            if path is not None and kind_of(path.name) is not None:  # a document: its bytes and name
                fields_["file_base64"] = base64.b64encode(body).decode("ascii")
                fields_["file_name"] = path.name
            elif is_pdf:
                fields_["pdf_base64"] = base64.b64encode(body).decode("ascii")
            else:
                text = body.decode("utf-8", errors="replace")
                fields_["html" if is_html else "text"] = text
                if not is_html and path is not None:
                    fields_["title"] = path.name
            got = kb.add_capture(**fields_)
            known = {f.name for f in fields(SourceReport)}
            rep = SourceReport(**{k: v for k, v in got.items() if k in known})
            rep.name = name
        except OSError as err:
            rep = SourceReport(name, "failed", error={"code": "invalid_document",
                                                      "message": f"cannot read the file: {err.strerror}"})
        except LocalKBError as err:
            rep = SourceReport(name, "failed", error={"code": err.code, "message": str(err)})
        report.sources.append(rep)
    return report

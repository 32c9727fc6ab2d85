"""``localkb team …``: run the team server, administer it, attach to one. Parse, call the core, print.

Administration (users, roles, grants, tokens, knowledge bases) talks to the team
database directly, as ``createuser`` does: ``--db URL`` (or ``LOCALKB_TEAM_DB``) for
an existing PostgreSQL, else the embedded one in ``--dir`` (default ``<data dir>/team``),
started for the command and stopped after it when no ``team serve`` is running there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from localkb.config import Settings
from localkb.errors import InvalidInput
from localkb.strings import plural

#: ``team serve``'s database pool: connections held at most, and seconds a request waits for one.
POOL_SIZE = 32
POOL_WAIT_S = 10.0


def _settings() -> Settings:
    return Settings.from_env()


def _team_dir(args) -> Path:
    return Path(args.dir).expanduser() if args.dir else _settings().data_dir / "team"


@contextmanager
def admin_database(args):
    """The team database for one admin command (the embedded cluster started only if needed)."""
    from localkb.team.db import Database
    from localkb.team.embedded import EmbeddedPostgres

    url = args.db or os.environ.get("LOCALKB_TEAM_DB")
    pg = None
    if url is None:
        pg = EmbeddedPostgres(_team_dir(args))
        if pg.standalone():
            url, pg = pg.url(), None  # started on its own for several servers: use it as it runs
        elif pg.acquire(wait=False):
            url = pg.start()  # no server runs here: start it for this command
        else:
            url = pg.url()  # a ``team serve`` holds the cluster: use it as it runs
            pg = None
    try:
        db = Database(url, min_size=1, max_size=2)
        try:
            yield db
        finally:
            db.close()
    finally:
        if pg is not None:
            pg.stop()
            pg.release()


@contextmanager
def throwaway_team_store(url: str | None):
    """A team store in a database of its own, dropped afterwards (evals and benchmarks)."""
    import shutil
    import tempfile
    import uuid

    import psycopg

    from localkb.team.db import Database
    from localkb.team.embedded import EmbeddedPostgres

    pg = base = None
    if url is None:
        base = Path(tempfile.mkdtemp(prefix="localkb-eval-pg-"))
        pg = EmbeddedPostgres(base / "team")
        pg.acquire()
        url = pg.start()
    name = "eval_" + uuid.uuid4().hex[:10]
    admin_url = url
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        own = psycopg.conninfo.make_conninfo(url, dbname=name)
        db = Database(own)
        try:
            yield _system_store(db)
        finally:
            db.close()
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        if pg is not None:
            pg.stop()
            pg.release()
            shutil.rmtree(base, ignore_errors=True)


def _system_store(db):
    from localkb.team.access import Access
    from localkb.team.store import TeamStore

    return TeamStore(db, _settings(), Access.system())


# -- a database several servers share -----------------------------------------------------
def cmd_db(args, out) -> int:
    """``team db start|stop|status``: the embedded PostgreSQL run on its own, for several servers."""
    from localkb.team.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(_team_dir(args))
    if args.action == "start":
        url = pg.start_standalone()
        out.emit({"url": url, "dir": str(pg.team_dir)},
                 f"the team database runs on its own in {pg.team_dir}; start servers with\n"
                 f"  localkb team serve --dir {pg.team_dir} --port PORT   (or --db URL), and stop it "
                 f"with `localkb team db stop`\n{url}")
        return 0
    if args.action == "stop":
        stopped = pg.stop_standalone()
        out.emit({"stopped": stopped}, "the team database is stopped" if stopped
                 else "the team database was not running")
        return 0
    running = pg.running()
    out.emit({"running": running, "standalone": pg.standalone(), "url": pg.url() if running else None},
             (f"running{' on its own' if pg.standalone() else ' (owned by a team serve)'}: {pg.url()}"
              if running else "not running"))
    return 0 if running else 1


# -- caps -------------------------------------------------------------------------------
def cmd_caps(args, out) -> int:
    """``team caps show|set NAME VALUE``: the caps every server reads from the database."""
    from localkb.team.limits import RateLimiter

    with admin_database(args) as db:
        limiter = RateLimiter(db)
        caps = limiter.set(args.name, args.value) if args.action == "set" else limiter.current()
    shown = RateLimiter.public(caps)
    out.emit(shown, "\n".join(f"{k.replace('_', '-'):<16} {v if v else 'off'}" for k, v in shown.items()))
    return 0


# -- serve ------------------------------------------------------------------------------
def cmd_serve(args, out) -> int:
    import logging

    from localkb.team import proxies
    from localkb.team.hosts import HostNames
    from localkb.team.server import serve

    HostNames.of(args.allowed_host or ())  # a bad name is refused before PostgreSQL starts
    proxies.networks(args.trusted_proxy or ())  # and so is a bad network
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"localkb team: listening on {args.host} over plain HTTP: tokens and passages cross the "
              "network in the clear unless a TLS proxy sits in front", file=sys.stderr)

    def ready(url: str) -> None:
        where = "the PostgreSQL at --db" if args.db else f"the embedded PostgreSQL in {_team_dir(args)}"
        print(f"localkb team server {args.name!r} listening on {url} (database: {where})", flush=True)

    if args.pool_size < 1 or not 0 < args.pool_wait <= 600:
        raise InvalidInput("--pool-size must be at least 1 and --pool-wait from 0 to 600 seconds")
    from localkb.team import accesslog

    accesslog.configure(args.access_log)
    serve(args.db or os.environ.get("LOCALKB_TEAM_DB"), team_dir=_team_dir(args), host=args.host,
          port=args.port, name=args.name, settings=_settings(), ready=ready, stop=stop,
          chat=chat_config(args), rerank_model=args.rerank_model,
          allowed_hosts=tuple(args.allowed_host or ()),
          trusted_proxies=tuple(args.trusted_proxy or ()), pool_size=args.pool_size,
          pool_wait=args.pool_wait)
    print("localkb team server stopped", flush=True)
    return 0


def chat_config(args):
    """Team chat's configuration from ``team serve``'s flags."""
    from localkb.answer.llm import Endpoint
    from localkb.team.chat import ChatConfig
    from localkb.team.guard import Policy
    from localkb.team.limits import Caps

    endpoint = None
    if args.llm_url:
        if not args.llm_model:
            raise InvalidInput("--llm-url needs --llm-model")
        endpoint = Endpoint("team", args.llm_url, args.llm_model, api_key_env=args.llm_key_env,
                            mark_cloud=args.llm_cloud)
    policy = (Policy.from_file(Path(args.deny_list), max_chars=args.max_chars) if args.deny_list
              else Policy(max_chars=args.max_chars))
    if args.semantic_threshold is not None and not 0.0 < args.semantic_threshold <= 1.0:
        raise InvalidInput("--semantic-threshold is a cosine from 0 (exclusive) to 1")
    caps = Caps(args.daily_cap_user, args.daily_cap_address, args.daily_cap_service,
                args.minute_cap_user, args.minute_cap_address)
    return ChatConfig(endpoint=endpoint, caps=caps,
                      policy=policy, semantic_threshold=args.semantic_threshold)


def cmd_log(args, out) -> int:
    from localkb.team.access import Access
    from localkb.team.querylog import QueryLog

    with admin_database(args) as db:
        qlog = QueryLog(db)
        if args.action == "export":
            body = qlog.export(Access.system(), args.format, user=args.user)
            if args.output:
                Path(args.output).write_bytes(body)
                out.emit({"written": args.output, "bytes": len(body)},
                         f"wrote {len(body):,} bytes to {args.output}")
            else:
                sys.stdout.write(body.decode())
            return 0
        rows, total = qlog.list(Access.system(), user=args.user, limit=args.limit)
    lines = [f"{total} queries logged" + (f" by {args.user}" if args.user else "")]
    for r in rows:
        stages = " ".join(f"{k} {v:.0f}" for k, v in r["stages"].items() if v)
        code = f" {r['error_code']}" if r["error_code"] else ""
        lines.append(f"#{r['id']} {r['user']} {r['outcome']}{code}"
                     f"{' cache:' + r['cache'] if r['cache'] else ''} · {r['query'][:60]!r} · "
                     f"{len(r['citations'])} citations · {r['total_ms']:.0f} ms ({stages})")
    out.emit({"queries": rows, "total": total}, "\n".join(lines))
    return 0


def cmd_audit(args, out) -> int:
    from localkb.team.audit import AuditLog

    with admin_database(args) as db:
        rows, total = AuditLog(db).list(limit=args.limit)
    lines = [f"{total} administrative changes logged"]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["at"]))
        lines.append(f"#{r['id']} {when} UTC {r['actor']} {r['action']} {r['target']} "
                     f"{json.dumps(r['detail'], ensure_ascii=False)}")
    out.emit({"audit": rows, "total": total}, "\n".join(lines))
    return 0


def _actor() -> str:
    """The audit log's actor for a CLI change: the operating-system user who ran it."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


# -- admin --------------------------------------------------------------------------------
def cmd_user(args, out) -> int:
    from localkb.team.access import Directory

    with admin_database(args) as db:
        d = Directory(db, actor=_actor())
        if args.action == "add":
            res = d.add_user(args.name, admin=args.admin, roles=args.role or [])
            text = f"added user {res['name']} (roles: {', '.join(res['roles']) or 'none'})"
        elif args.action == "remove":
            res = d.remove_user(args.name)
            text = f"removed user {res['removed']} and their tokens"
        elif args.action == "roles":
            res = d.set_user_roles(args.name, add=args.add or [], remove=args.remove or [])
            text = f"{res['name']}: roles {', '.join(res['roles']) or 'none'}"
        else:
            res = {"users": d.users()}
            text = "\n".join(f"{u['name']:20} {'admin ' if u['admin'] else ''}roles: "
                             f"{', '.join(u['roles']) or '-'}; live tokens: "
                             f"{sum(1 for t in u['tokens'] if t['revoked'] is None)}"
                             for u in res["users"]) or "no users yet: localkb team user add NAME"
    out.emit(res, text)
    return 0


def cmd_role(args, out) -> int:
    from localkb.team.access import Directory

    with admin_database(args) as db:
        d = Directory(db, actor=_actor())
        if args.action == "add":
            res = d.add_role(args.name, args.clearance)
            text = f"added role {res['name']} (clearance {res['clearance']})"
        elif args.action == "remove":
            res = d.remove_role(args.name)
            text = f"removed role {res['removed']} and its grants"
        elif args.action == "clearance":
            res = d.set_clearance(args.name, args.clearance)
            text = f"{res['name']}: clearance {res['clearance']}"
        else:
            res = {"roles": d.roles()}
            text = "\n".join(f"{r['name']:20} {r['clearance']:13} "
                             + (", ".join(f"{g['kb_name']}{' (write)' if g['write'] else ''}"
                                          for g in r["grants"]) or "no grants")
                             for r in res["roles"]) or "no roles yet: localkb team role add NAME"
    out.emit(res, text)
    return 0


def cmd_grant(args, out) -> int:
    from localkb.team.access import Directory

    with admin_database(args) as db:
        rec = _system_store(db).resolve(args.kb)
        d = Directory(db, actor=_actor())
        if args.command_name == "grant":
            res = d.grant(args.role, rec.id, write=args.write)
            text = f"{args.role} may now {'read and write' if args.write else 'read'} {rec.name}"
        else:
            res = d.revoke(args.role, rec.id)
            text = f"{args.role} may no longer read {rec.name} (from its next query)"
    out.emit(res, text)
    return 0


def cmd_token(args, out) -> int:
    from localkb.team.access import Directory

    with admin_database(args) as db:
        d = Directory(db, actor=_actor())
        if args.action == "create":
            res = d.create_token(args.user, args.name)
            text = (f"{res['token']}\n(the only time this token is shown: give it to {res['user']}; "
                    f"revoke with `localkb team token revoke {res['id']}`)")
        else:
            res = d.revoke_token(args.id)
            text = f"revoked token {res['revoked']} (refused from its next request)"
    out.emit(res, text)
    return 0


def cmd_kb(args, out) -> int:
    from localkb.team.access import level_of

    with admin_database(args) as db:
        store = _system_store(db)
        if args.action == "create":
            rec = store.create_kb(args.name, privacy=args.privacy, model=args.model,
                                  default_access=level_of(args.default_access))
            res = store.describe(rec)
            text = f"created team knowledge base {rec.name} ({rec.id}, {rec.privacy})"
        elif args.action == "update":
            rec = store.update_kb(args.kb, name=args.name, privacy=args.privacy,
                                  default_access=None if args.default_access is None
                                  else level_of(args.default_access))
            res = store.describe(rec)
            text = f"updated {rec.name} ({rec.privacy}, new sources {res['default_access']})"
        elif args.action == "reembed":
            from localkb.ingest.reembed import reembed

            res = reembed(store, args.kb, args.model, batch_size=args.batch_size).to_dict()
            text = res["summary"]
        elif args.action == "delete":
            rec = store.delete_kb(args.kb)
            res = {"deleted": rec.id, "name": rec.name}
            text = f"deleted team knowledge base {rec.name}"
        else:
            rows = [store.describe(r) for r in store.kbs()]
            res = {"knowledge_bases": rows}
            text = "\n".join(f"{r['name'][:24]:24} {r['privacy']:7} {r['sources']:>7} sources "
                             f"{r['chunks']:>7} chunks  new sources {r['default_access']:12} {r['id']}"
                             for r in rows) or "no team knowledge bases yet: localkb team kb create NAME"
    out.emit(res, text)
    return 0


# -- attach -------------------------------------------------------------------------------
def cmd_attach(args, out) -> int:
    from localkb.team.attached import attach

    if not args.token_stdin:
        raise InvalidInput("give the token on stdin: localkb team attach URL --token-stdin < token-file")
    res = attach(_settings().data_dir, args.url, sys.stdin.readline().strip(), name=args.name)
    names = ", ".join(k["name"] for k in res["knowledge_bases"]) or "none yet"
    out.emit(res, f"attached team {res['team']} at {res['url']} as {res['user']}: knowledge bases {names}")
    return 0


def cmd_detach(args, out) -> int:
    from localkb.team.attached import detach

    res = detach(_settings().data_dir, args.name)
    out.emit(res, f"detached {res['detached']}")
    return 0


def cmd_teams(args, out) -> int:
    from localkb.store.kb import Store
    from localkb.team.attached import Library

    lib = Library(Store(_settings()))
    states = {s["team"]: s for s in lib.refresh()}
    res = {"teams": [{**t.public(), "reachable": states[t.name]["ok"],
                      "error": states[t.name].get("error")} for t in lib.teams]}
    text = "\n".join(f"{t['name']:16} {t['url']:32} {t['knowledge_bases']} knowledge bases "
                     + ("" if t["reachable"] else f"UNREACHABLE: {t['error']['message']}")
                     for t in res["teams"]) or "no team attached: localkb team attach URL --token-stdin"
    out.emit(res, text)
    return 0


def cmd_set_access(args, out) -> int:
    from localkb.store.kb import Store
    from localkb.team.attached import Library

    kb = Library(Store(_settings())).open_kb(args.kb)
    if not getattr(kb, "remote", False):
        raise InvalidInput(f"{kb.record.name!r} is a local knowledge base: access levels are a team's")
    res = kb.set_access(args.source, args.level)
    out.emit(res, f"{res['title']}: {res['was']} -> {res['access']} ({plural(res['chunks'], 'passage')})")
    return 0


# -- parser -------------------------------------------------------------------------------
def add_parser(sub, common: argparse.ArgumentParser) -> None:
    """The ``team`` command group."""
    from localkb.team.schema import LEVELS

    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=None, help="PostgreSQL URL (default: LOCALKB_TEAM_DB, else embedded)")
    db.add_argument("--dir", default=None, help="the embedded PostgreSQL's folder (default <data dir>/team)")
    team = sub.add_parser("team", help="the team server: serve, administer, attach")
    ts = team.add_subparsers(dest="team_command", required=True)

    c = ts.add_parser("serve", parents=[common, db], help="run the team server (embedded PostgreSQL "
                                                           "unless --db)")
    c.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    c.add_argument("--port", type=int, default=8765)
    c.add_argument("--name", default="team", help="the team's name, shown beside its knowledge bases")
    c.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="a Host name this server answers to beside localhost and IP addresses "
                   "(repeatable; the name clients and a TLS proxy use)")
    c.add_argument("--llm-url", default=None, help="team chat's model: an OpenAI-compatible API root "
                   "(default: none, answers quote the passages)")
    c.add_argument("--llm-model", default=None, help="the model name sent to --llm-url")
    c.add_argument("--llm-key-env", default=None, help="environment variable holding its API key")
    c.add_argument("--llm-cloud", action="store_true",
                   help="treat --llm-url as cloud even on loopback (a proxy to a cloud model)")
    c.add_argument("--rerank-model", default=None,
                   help="a cross-encoder ONNX file (tokenizer.json beside it) for the top 50")
    c.add_argument("--daily-cap-user", type=int, default=500,
                   help="chat requests per user per UTC day (0: off); the first server's "
                   "caps fill in the database, `localkb team caps set` changes them")
    c.add_argument("--daily-cap-address", type=int, default=2000,
                   help="chat requests per client address per UTC day (0: off)")
    c.add_argument("--daily-cap-service", type=int, default=0,
                   help="chat requests for the whole service per UTC day (0: off)")
    c.add_argument("--minute-cap-user", type=int, default=0,
                   help="chat and search requests per user per minute (0: off)")
    c.add_argument("--minute-cap-address", type=int, default=0,
                   help="chat and search requests per client address per minute (0: off)")
    c.add_argument("--trusted-proxy", action="append", metavar="CIDR",
                   help="a TLS proxy's address or network whose X-Forwarded-For names the client "
                   "(repeatable); caps and the log then count the client, not the proxy")
    c.add_argument("--deny-list", default=None, help="a file of refused phrases or `name: regex` lines")
    c.add_argument("--max-chars", type=int, default=4000, help="longest chat message accepted")
    c.add_argument("--semantic-threshold", type=float, default=None,
                   help="serve a cached answer to a question this close (cosine); default off (see README)")
    c.add_argument("--pool-size", type=int, default=POOL_SIZE,
                   help=f"PostgreSQL connections the server holds at most (default {POOL_SIZE})")
    c.add_argument("--pool-wait", type=float, default=POOL_WAIT_S,
                   help="seconds a request waits for a connection before a 503 team_busy with "
                   f"Retry-After (default {POOL_WAIT_S:g})")
    c.add_argument("--access-log", default="-", metavar="FILE",
                   help="one JSON line per request: '-' stderr (default), a file, or 'off'")
    c.set_defaults(func=cmd_serve)
    dbp = ts.add_parser("db", help="the embedded PostgreSQL on its own, for several servers")
    dbs = dbp.add_subparsers(dest="action", required=True)
    for action, helptext in (("start", "start it for servers that do not own it; prints its URL"),
                             ("stop", "stop it (servers using it lose their database)"),
                             ("status", "whether it runs (exit 1 when not), and its URL")):
        c = dbs.add_parser(action, parents=[common, db], help=helptext)
        c.set_defaults(func=cmd_db)
    capsp = ts.add_parser("caps", help="request caps every server reads from the database")
    cs = capsp.add_subparsers(dest="action", required=True)
    c = cs.add_parser("show", parents=[common, db])
    c.set_defaults(func=cmd_caps)
    c = cs.add_parser("set", parents=[common, db], help="change one cap (0: off), for every server at once")
    c.add_argument("name", choices=["user-day", "address-day", "service-day", "user-minute",
                                    "address-minute"])
    c.add_argument("value", type=int)
    c.set_defaults(func=cmd_caps)
    c = ts.add_parser("log", parents=[common, db], help="the team chat query log: list or export")
    c.add_argument("action", choices=["list", "export"])
    c.add_argument("--user", default=None, help="only this user's queries")
    c.add_argument("--limit", type=int, default=20)
    c.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    c.add_argument("--output", "-o", default=None, help="export to this file (default: stdout)")
    c.set_defaults(func=cmd_log)
    c = ts.add_parser("audit", parents=[common, db], help="the audit log of administrative changes")
    c.add_argument("action", choices=["list"])
    c.add_argument("--limit", type=int, default=50)
    c.set_defaults(func=cmd_audit)

    user = ts.add_parser("user", help="add, remove and list users")
    us = user.add_subparsers(dest="action", required=True)
    c = us.add_parser("add", parents=[common, db])
    c.add_argument("name")
    c.add_argument("--role", action="append", help="a role to give (repeatable)")
    c.add_argument("--admin", action="store_true", help="may create knowledge bases and import over the API")
    c.set_defaults(func=cmd_user)
    c = us.add_parser("remove", parents=[common, db])
    c.add_argument("name")
    c.set_defaults(func=cmd_user)
    c = us.add_parser("roles", parents=[common, db], help="give or take roles")
    c.add_argument("name")
    c.add_argument("--add", action="append")
    c.add_argument("--remove", action="append")
    c.set_defaults(func=cmd_user)
    c = us.add_parser("list", parents=[common, db])
    c.set_defaults(func=cmd_user)

    role = ts.add_parser("role", help="roles and their clearance (" + " < ".join(LEVELS) + ")")
    rs = role.add_subparsers(dest="action", required=True)
    c = rs.add_parser("add", parents=[common, db])
    c.add_argument("name")
    c.add_argument("--clearance", required=True, choices=LEVELS)
    c.set_defaults(func=cmd_role)
    c = rs.add_parser("clearance", parents=[common, db], help="change a role's clearance")
    c.add_argument("name")
    c.add_argument("clearance", choices=LEVELS)
    c.set_defaults(func=cmd_role)
    c = rs.add_parser("remove", parents=[common, db])
    c.add_argument("name")
    c.set_defaults(func=cmd_role)
    c = rs.add_parser("list", parents=[common, db])
    c.set_defaults(func=cmd_role)

    for name, helptext in (("grant", "let a role read (or --write) a team knowledge base"),
                           ("revoke", "take a role's grant away (effective from the next query)")):
        c = ts.add_parser(name, parents=[common, db], help=helptext)
        c.add_argument("role")
        c.add_argument("kb")
        if name == "grant":
            c.add_argument("--write", action="store_true", help="may also add and remove sources")
        c.set_defaults(func=cmd_grant, command_name=name)

    token = ts.add_parser("token", help="API tokens (stored hashed; shown once)")
    tks = token.add_subparsers(dest="action", required=True)
    c = tks.add_parser("create", parents=[common, db])
    c.add_argument("user")
    c.add_argument("--name", default="default", help="a label for the token")
    c.set_defaults(func=cmd_token)
    c = tks.add_parser("revoke", parents=[common, db])
    c.add_argument("id", help="the token's id (or the token itself)")
    c.set_defaults(func=cmd_token)

    kb = ts.add_parser("kb", help="team knowledge bases")
    ks = kb.add_subparsers(dest="action", required=True)
    c = ks.add_parser("create", parents=[common, db])
    c.add_argument("name")
    c.add_argument("--privacy", choices=["device", "cloud"], default="device",
                   help="may its passages reach a cloud model (default device: never)")
    c.add_argument("--model", default=None)
    c.add_argument("--default-access", choices=LEVELS, default="public",
                   help="the level of sources added without one")
    c.set_defaults(func=cmd_kb)
    c = ks.add_parser("update", parents=[common, db])
    c.add_argument("kb")
    c.add_argument("--name")
    c.add_argument("--privacy", choices=["device", "cloud"])
    c.add_argument("--default-access", choices=LEVELS)
    c.set_defaults(func=cmd_kb)
    c = ks.add_parser("delete", parents=[common, db])
    c.add_argument("kb")
    c.set_defaults(func=cmd_kb)
    c = ks.add_parser("reembed", parents=[common, db], help="move it to another embedding model "
                                                          "(staged, writers paused only for the switch)")
    c.add_argument("kb")
    c.add_argument("--model", required=True)
    c.add_argument("--batch-size", type=int, default=64)
    c.set_defaults(func=cmd_kb)
    c = ks.add_parser("list", parents=[common, db])
    c.set_defaults(func=cmd_kb)

    c = ts.add_parser("attach", parents=[common], help="show a team's knowledge bases beside yours")
    c.add_argument("url")
    c.add_argument("--token-stdin", action="store_true", help="read the API token from stdin")
    c.add_argument("--name", default=None, help="what to call the team here (default: the server's name)")
    c.set_defaults(func=cmd_attach)
    c = ts.add_parser("detach", parents=[common], help="forget an attached team")
    c.add_argument("name")
    c.set_defaults(func=cmd_detach)
    c = ts.add_parser("list", parents=[common], help="attached teams and whether they answer")
    c.set_defaults(func=cmd_teams)
    c = ts.add_parser("access", parents=[common], help="change a team source's access level")
    c.add_argument("kb")
    c.add_argument("source", help="source id or URL")
    c.add_argument("level", choices=LEVELS)
    c.set_defaults(func=cmd_set_access)

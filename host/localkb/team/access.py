"""Who may see what on the team server: users, roles with clearances, grants, API tokens.

A user holds roles; a role has a clearance (one of ``LEVELS``) and is granted knowledge
bases (read, or read and write). An administrator sees and manages every knowledge base
at every level (they can grant themselves anything anyway, so nothing is pretended).
On a knowledge base a user sees the passages whose level is at or below the highest
clearance among their roles granted it; a knowledge base none of their roles is granted
does not exist for them. Access is read from the database on every request, so a revoked
grant or token counts from the next query.

Tokens are ``lkt_<id>_<secret>``: the id finds the row, the secret (32 random bytes)
is kept only as its SHA-256 digest and compared in constant time. A high-entropy
random secret needs no slow hash; a stolen table gives no usable token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field

from localkb.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from localkb.team.db import Database
from localkb.team.schema import LEVELS

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
_TOKEN = re.compile(r"^lkt_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


def level_of(value: object) -> int:
    """A level given as a name (``confidential``) or a number (0-3)."""
    if isinstance(value, bool):
        raise InvalidInput(f"an access level is one of {', '.join(LEVELS)} (or 0-{len(LEVELS) - 1})")
    if isinstance(value, int) and 0 <= value < len(LEVELS):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in LEVELS:
            return LEVELS.index(low)
        if low.isdigit() and int(low) < len(LEVELS):
            return int(low)
    raise InvalidInput(f"an access level is one of {', '.join(LEVELS)} (or 0-{len(LEVELS) - 1})",
                       detail={"field": "access"})


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(f"a {kind} name is 1-64 letters, digits or _ . @ + -, starting with a "
                           "letter or digit", detail={"field": kind})
    return name


@dataclass(frozen=True)
class Grant:
    level: int
    can_write: bool


@dataclass(frozen=True)
class Access:
    """One request's view: the user, and per visible knowledge base its level and write right.

    ``kbs`` None is the server's own view (admin commands): every knowledge base, every level.
    """

    user_id: str | None
    user: str
    is_admin: bool = False
    kbs: dict[str, Grant] | None = field(default=None)

    @classmethod
    def system(cls) -> Access:
        return cls(user_id=None, user="(admin)", is_admin=True, kbs=None)

    @property
    def everything(self) -> bool:
        """Administrators (and the server itself) see every knowledge base at every level."""
        return self.kbs is None or self.is_admin

    def grant(self, kb_id: str) -> Grant | None:
        if self.everything:
            return Grant(len(LEVELS) - 1, True)
        return self.kbs.get(kb_id)

    def key(self) -> tuple:
        """What this access set is, as a cache key part (issue 20's caches key on it)."""
        if self.everything:
            return ("*",)
        return tuple(sorted((k, g.level, g.can_write) for k, g in self.kbs.items()))

    def public(self) -> dict:
        return {"user": self.user, "admin": self.is_admin,
                "knowledge_bases": None if self.kbs is None else {
                    k: {"level": LEVELS[g.level], "write": g.can_write} for k, g in self.kbs.items()}}


#: How stale a token's ``last_used`` may be: it is written on a request at most this often.
LAST_USED_EVERY_S = 300


def token_digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class Directory:
    """Users, roles, grants and tokens in the team database."""

    def __init__(self, db: Database, *, actor: str = "cli", instance: str | None = None) -> None:
        self.db = db
        #: Who the audit log names for changes made through this directory.
        self.actor = actor
        self.instance = instance

    def _audit(self, conn, action: str, target: str, **detail) -> None:
        from localkb.team import audit

        audit.write(conn, self.actor, action, target, detail, instance=self.instance)

    # -- authentication ------------------------------------------------------------------
    def authenticate(self, token: str | None) -> Access:
        """The access of a bearer token, or ``Unauthorized`` (missing, malformed, wrong, revoked)."""
        if not token:
            raise Unauthorized("no API token: send 'Authorization: Bearer lkt_…'")
        m = _TOKEN.match(token)
        if m is None:
            raise Unauthorized("the API token is not a LocalKB team token")
        with self.db.conn() as conn:
            row = conn.execute(
                "SELECT t.user_id, t.digest, t.revoked, t.last_used, u.name, u.is_admin FROM tokens t "
                "JOIN users u ON u.id = t.user_id WHERE t.id = %s", (m.group(1),)).fetchone()
            # Compared even when there is no row, so a wrong id costs the same as a wrong secret.
            good = hmac.compare_digest(bytes(row["digest"]) if row else b"\0" * 32,
                                       token_digest(m.group(2)))
            if row is None or not good:
                raise Unauthorized("the API token is not valid")
            if row["revoked"] is not None:
                raise Unauthorized("the API token was revoked")
            now = time.time()
            # Written at most once per LAST_USED_EVERY_S per token, never once per request: a
            # write on every request serialises a busy team on the token rows.
            if row["last_used"] is None or now - row["last_used"] >= LAST_USED_EVERY_S:
                conn.execute("UPDATE tokens SET last_used = %s WHERE id = %s", (now, m.group(1)))
            conn.commit()
        return self.access(row["user_id"], row["name"], row["is_admin"])

    def access(self, user_id: str, name: str, is_admin: bool) -> Access:
        with self.db.conn() as conn:
            rows = conn.execute(
                "SELECT g.kb_id, max(r.clearance) AS level, bool_or(g.can_write) AS can_write "
                "FROM user_roles ur JOIN roles r ON r.id = ur.role_id "
                "JOIN grants g ON g.role_id = r.id WHERE ur.user_id = %s GROUP BY g.kb_id",
                (user_id,)).fetchall()
        return Access(user_id=user_id, user=name, is_admin=is_admin,
                      kbs={r["kb_id"]: Grant(int(r["level"]), bool(r["can_write"])) for r in rows})

    # -- users -----------------------------------------------------------------------------
    def add_user(self, name: str, *, admin: bool = False, roles: list[str] = ()) -> dict:
        name = _check_name("user", name)
        uid = "u_" + uuid.uuid4().hex[:12]
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM users WHERE lower(name) = lower(%s)", (name,)).fetchone():
                raise Conflict(f"a user named {name!r} already exists")
            conn.execute("INSERT INTO users (id, name, is_admin, created) VALUES (%s, %s, %s, %s)",
                         (uid, name, admin, time.time()))
            for role in roles:
                rid = self._role_id(conn, role)
                conn.execute("INSERT INTO user_roles VALUES (%s, %s) ON CONFLICT DO NOTHING", (uid, rid))
            self._audit(conn, "user.add", name, admin=admin, roles=list(roles))
        return self.user(name)

    def remove_user(self, name: str) -> dict:
        with self.db.tx() as conn:
            row = conn.execute("DELETE FROM users WHERE lower(name) = lower(%s) RETURNING id, name",
                               (name,)).fetchone()
            if row is not None:
                self._audit(conn, "user.remove", row["name"])
        if row is None:
            raise NotFound(f"no user named {name!r}")
        return {"removed": row["name"], "id": row["id"]}

    def user(self, name: str) -> dict:
        with self.db.conn() as conn:
            row = conn.execute("SELECT * FROM users WHERE lower(name) = lower(%s)", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no user named {name!r}")
            roles = [r["name"] for r in conn.execute(
                "SELECT r.name FROM user_roles ur JOIN roles r ON r.id = ur.role_id "
                "WHERE ur.user_id = %s ORDER BY r.name", (row["id"],))]
            tokens = conn.execute("SELECT id, name, created, last_used, revoked FROM tokens "
                                  "WHERE user_id = %s ORDER BY created", (row["id"],)).fetchall()
        return {"id": row["id"], "name": row["name"], "admin": row["is_admin"], "roles": roles,
                "tokens": [dict(t) for t in tokens]}

    def users(self) -> list[dict]:
        with self.db.conn() as conn:
            names = [r["name"] for r in conn.execute("SELECT name FROM users ORDER BY lower(name)")]
        return [self.user(n) for n in names]

    def set_user_roles(self, name: str, *, add: list[str] = (), remove: list[str] = ()) -> dict:
        with self.db.tx() as conn:
            uid = self._user_id(conn, name)
            for role in add:
                conn.execute("INSERT INTO user_roles VALUES (%s, %s) ON CONFLICT DO NOTHING",
                             (uid, self._role_id(conn, role)))
            for role in remove:
                conn.execute("DELETE FROM user_roles WHERE user_id = %s AND role_id = %s",
                             (uid, self._role_id(conn, role)))
            self._audit(conn, "user.roles", name, add=list(add), remove=list(remove))
        return self.user(name)

    # -- roles -----------------------------------------------------------------------------
    def add_role(self, name: str, clearance: object) -> dict:
        name = _check_name("role", name)
        level = level_of(clearance)
        with self.db.tx() as conn:
            if conn.execute("SELECT 1 FROM roles WHERE lower(name) = lower(%s)", (name,)).fetchone():
                raise Conflict(f"a role named {name!r} already exists")
            conn.execute("INSERT INTO roles (id, name, clearance, created) VALUES (%s, %s, %s, %s)",
                         ("r_" + uuid.uuid4().hex[:12], name, level, time.time()))
            self._audit(conn, "role.add", name, clearance=LEVELS[level])
        return self.role(name)

    def set_clearance(self, name: str, clearance: object) -> dict:
        with self.db.tx() as conn:
            n = conn.execute("UPDATE roles SET clearance = %s WHERE lower(name) = lower(%s)",
                             (level_of(clearance), name)).rowcount
            if n:
                self._audit(conn, "role.clearance", name, clearance=LEVELS[level_of(clearance)])
        if not n:
            raise NotFound(f"no role named {name!r}")
        return self.role(name)

    def remove_role(self, name: str) -> dict:
        with self.db.tx() as conn:
            row = conn.execute("DELETE FROM roles WHERE lower(name) = lower(%s) RETURNING name",
                               (name,)).fetchone()
            if row is not None:
                self._audit(conn, "role.remove", row["name"])
        if row is None:
            raise NotFound(f"no role named {name!r}")
        return {"removed": row["name"]}

    def role(self, name: str) -> dict:
        with self.db.conn() as conn:
            row = conn.execute("SELECT * FROM roles WHERE lower(name) = lower(%s)", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no role named {name!r}")
            grants = conn.execute(
                "SELECT k.id, k.name, g.can_write FROM grants g JOIN kbs k ON k.id = g.kb_id "
                "WHERE g.role_id = %s ORDER BY lower(k.name)", (row["id"],)).fetchall()
        return {"name": row["name"], "clearance": LEVELS[row["clearance"]],
                "grants": [{"kb": g["id"], "kb_name": g["name"], "write": g["can_write"]} for g in grants]}

    def roles(self) -> list[dict]:
        with self.db.conn() as conn:
            names = [r["name"] for r in conn.execute("SELECT name FROM roles ORDER BY lower(name)")]
        return [self.role(n) for n in names]

    # -- grants ----------------------------------------------------------------------------
    def grant(self, role: str, kb_id: str, *, write: bool = False) -> dict:
        with self.db.tx() as conn:
            rid = self._role_id(conn, role)
            conn.execute("INSERT INTO grants VALUES (%s, %s, %s) ON CONFLICT (role_id, kb_id) "
                         "DO UPDATE SET can_write = excluded.can_write", (rid, kb_id, write))
            self._audit(conn, "grant", role, kb=kb_id, write=write)
        return self.role(role)

    def revoke(self, role: str, kb_id: str) -> dict:
        with self.db.tx() as conn:
            n = conn.execute("DELETE FROM grants WHERE role_id = %s AND kb_id = %s",
                             (self._role_id(conn, role), kb_id)).rowcount
            if n:
                self._audit(conn, "revoke", role, kb=kb_id)
        if not n:
            raise NotFound(f"role {role!r} holds no grant on that knowledge base")
        return self.role(role)

    # -- tokens ----------------------------------------------------------------------------
    def create_token(self, user: str, name: str = "default") -> dict:
        """A new token for ``user``: the only time its secret is ever shown."""
        tid = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        with self.db.tx() as conn:
            uid = self._user_id(conn, user)
            conn.execute("INSERT INTO tokens (id, user_id, name, digest, created) "
                         "VALUES (%s, %s, %s, %s, %s)",
                         (tid, uid, str(name)[:80], token_digest(secret), time.time()))
            self._audit(conn, "token.create", user, token_id=tid, name=str(name)[:80])
        return {"token": f"lkt_{tid}_{secret}", "id": tid, "user": user, "name": name}

    def revoke_token(self, token_id: str) -> dict:
        tid = token_id[4:20] if token_id.startswith("lkt_") else token_id
        with self.db.tx() as conn:
            n = conn.execute("UPDATE tokens SET revoked = %s WHERE id = %s AND revoked IS NULL",
                             (time.time(), tid)).rowcount
            if n:
                self._audit(conn, "token.revoke", tid)
        if not n:
            raise NotFound(f"no live token with id {tid!r}")
        return {"revoked": tid}

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _user_id(conn, name: str) -> str:
        row = conn.execute("SELECT id FROM users WHERE lower(name) = lower(%s)", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no user named {name!r}")
        return row["id"]

    @staticmethod
    def _role_id(conn, name: str) -> str:
        row = conn.execute("SELECT id FROM roles WHERE lower(name) = lower(%s)", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no role named {name!r}")
        return row["id"]


def require_admin(access: Access) -> None:
    if not access.is_admin:
        raise Forbidden("only a team administrator may do this")

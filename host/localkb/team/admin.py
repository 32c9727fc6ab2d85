"""The administrators' page and the API behind it (``/admin``, ``/v1/admin/...``).

Everything ``localkb team user|role|grant|revoke|token`` does on the database host, over HTTP
for an administrator's token: users and their roles, roles and their clearance, grants,
tokens; knowledge bases (privacy, default access) and source levels use the routes that
already exist (``PATCH /v1/kbs/{kb}``, ``PATCH /v1/kbs/{kb}/sources/{source}``).

Every route checks the caller is an administrator before it reads anything. The page signs in
with a token it keeps in ``sessionStorage`` and sends as ``Authorization: Bearer``, never a
cookie, so another site's page cannot make the browser send it (no CSRF to defend against);
writes from another origin are refused anyway (``hosts.py``). The page is served with a
strict CSP (its own scripts only) and sets server text only as ``textContent``.

    GET    /v1/admin/users                 users with roles and tokens (never a secret)
    POST   /v1/admin/users                 {name, admin?, roles?}
    PATCH  /v1/admin/users/{name}          {add_roles?, remove_roles?}
    DELETE /v1/admin/users/{name}
    GET    /v1/admin/roles                 roles with clearance and grants
    POST   /v1/admin/roles                 {name, clearance}
    PATCH  /v1/admin/roles/{name}          {clearance}
    DELETE /v1/admin/roles/{name}
    POST   /v1/admin/grants                {role, kb, write?}
    POST   /v1/admin/grants/revoke         {role, kb}
    POST   /v1/admin/tokens                {user, name?}: the token, shown this once
    DELETE /v1/admin/tokens/{id}
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from localkb.errors import InvalidInput, NotFound
from localkb.inputs import req_bool, req_str
from localkb.team.access import Directory, require_admin
from localkb.team.schema import LEVELS

PAGE_FILES = {"": ("index.html", "text/html; charset=utf-8"),
              "app.js": ("app.js", "text/javascript; charset=utf-8"),
              "app.css": ("app.css", "text/css; charset=utf-8")}
PAGE_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
                                           "connect-src 'self'; frame-ancestors 'none'; form-action 'self'"}


def _names(data: dict, key: str) -> list[str]:
    value = data.get(key) or []
    if not isinstance(value, list) or len(value) > 100 or not all(
            isinstance(v, str) and 0 < len(v) <= 64 for v in value):
        raise InvalidInput(f"'{key}' must be a list of role names", detail={"field": key})
    return value


class TeamAdmin:
    def __init__(self, api) -> None:
        self.api = api

    def _dir(self, req) -> Directory:
        """The directory acting as the signed-in administrator (so the audit log names them)."""
        require_admin(req.access)
        return Directory(self.api.db, actor=req.access.user, instance=self.api.instance)

    def routes(self) -> list[tuple[str, tuple[str, ...], Any, bool]]:
        return [("GET", ("admin",), self.page, False),
                ("GET", ("admin", "*"), self.page, False),
                ("GET", ("v1", "admin", "users"), self.users, True),
                ("POST", ("v1", "admin", "users"), self.user_add, True),
                ("PATCH", ("v1", "admin", "users", "*"), self.user_roles, True),
                ("DELETE", ("v1", "admin", "users", "*"), self.user_remove, True),
                ("GET", ("v1", "admin", "roles"), self.roles, True),
                ("POST", ("v1", "admin", "roles"), self.role_add, True),
                ("PATCH", ("v1", "admin", "roles", "*"), self.role_clearance, True),
                ("DELETE", ("v1", "admin", "roles", "*"), self.role_remove, True),
                ("POST", ("v1", "admin", "grants"), self.grant, True),
                ("POST", ("v1", "admin", "grants", "revoke"), self.revoke, True),
                ("POST", ("v1", "admin", "tokens"), self.token_create, True),
                ("DELETE", ("v1", "admin", "tokens", "*"), self.token_revoke, True)]

    # -- the page ------------------------------------------------------------------------
    def page(self, req, name: str = "") -> tuple[bytes, dict]:
        if name not in PAGE_FILES:
            raise NotFound(f"no such file: /admin/{name}")
        file, ctype = PAGE_FILES[name]
        body = resources.files("localkb.team").joinpath("admin_page", file).read_bytes()
        return body, {"Content-Type": ctype, **PAGE_HEADERS}

    # -- users ---------------------------------------------------------------------------
    def users(self, req) -> dict:
        require_admin(req.access)
        return {"users": self._dir(req).users(), "levels": list(LEVELS)}

    def user_add(self, req) -> dict:
        require_admin(req.access)
        data = req.json()
        return self._dir(req).add_user(req_str(data, "name", max_len=64), admin=req_bool(data, "admin"),
                                       roles=_names(data, "roles"))

    def user_roles(self, req, name: str) -> dict:
        require_admin(req.access)
        data = req.json()
        return self._dir(req).set_user_roles(name, add=_names(data, "add_roles"),
                                             remove=_names(data, "remove_roles"))

    def user_remove(self, req, name: str) -> dict:
        require_admin(req.access)
        if name.lower() == (req.access.user or "").lower():
            raise InvalidInput("you cannot remove yourself: another administrator can",
                               detail={"field": "name"})
        return self._dir(req).remove_user(name)

    # -- roles ---------------------------------------------------------------------------
    def roles(self, req) -> dict:
        require_admin(req.access)
        return {"roles": self._dir(req).roles(), "levels": list(LEVELS)}

    def role_add(self, req) -> dict:
        require_admin(req.access)
        data = req.json()
        return self._dir(req).add_role(req_str(data, "name", max_len=64),
                                       req_str(data, "clearance", max_len=20))

    def role_clearance(self, req, name: str) -> dict:
        require_admin(req.access)
        return self._dir(req).set_clearance(name, req_str(req.json(), "clearance", max_len=20))

    def role_remove(self, req, name: str) -> dict:
        require_admin(req.access)
        return self._dir(req).remove_role(name)

    # -- grants --------------------------------------------------------------------------
    def _kb_id(self, req, ref: str) -> str:
        return self.api.store(req).resolve(ref).id

    def grant(self, req) -> dict:
        require_admin(req.access)
        data = req.json()
        return self._dir(req).grant(req_str(data, "role", max_len=64),
                                    self._kb_id(req, req_str(data, "kb", max_len=200)),
                                    write=req_bool(data, "write"))

    def revoke(self, req) -> dict:
        require_admin(req.access)
        data = req.json()
        return self._dir(req).revoke(req_str(data, "role", max_len=64),
                                     self._kb_id(req, req_str(data, "kb", max_len=200)))

    # -- tokens --------------------------------------------------------------------------
    def token_create(self, req) -> dict:
        require_admin(req.access)
        data = req.json()
        return self._dir(req).create_token(req_str(data, "user", max_len=64),
                                           req_str(data, "name", required=False, max_len=64) or "default")

    def token_revoke(self, req, token_id: str) -> dict:
        require_admin(req.access)
        return self._dir(req).revoke_token(token_id)

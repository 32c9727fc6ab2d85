"""The team server's client: one method per endpoint, our errors rebuilt from its error replies.

A server that cannot be reached (refused, timed out, a proxy's HTML, a dropped
connection) is ``TeamUnavailable``; an error reply keeps its stable code, so a
``kb_not_found`` from the server is a ``KnowledgeBaseNotFound`` here.
"""

from __future__ import annotations

from typing import Any

import httpx

from localkb import errors as E
from localkb.errors import LocalKBError, TeamUnavailable

TIMEOUT = httpx.Timeout(120.0, connect=5.0)
_BY_CODE: dict[str, type[LocalKBError]] = {
    cls.code: cls for cls in vars(E).values()
    if isinstance(cls, type) and issubclass(cls, LocalKBError)}


def error_from(payload: dict, status: int) -> LocalKBError:
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return TeamUnavailable(f"the team server answered HTTP {status} without an error body")
    cls = _BY_CODE.get(err["code"], LocalKBError)
    out = cls(str(err.get("message", ""))[:2000], detail=err.get("detail") or None)
    if cls is LocalKBError:
        out.code = err["code"]
    return out


class TeamClient:
    """Speaks the team API (``team.server``) with a bearer token."""

    def __init__(self, url: str, token: str | None, *, timeout: httpx.Timeout = TIMEOUT,
                 name: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.name = name or self.url
        headers = {"User-Agent": "localkb-team-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                  follow_redirects=False, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TeamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                content: bytes | None = None, raw: bool = False) -> Any:
        try:
            resp = self._http.request(method, path, json=json, params=params, content=content)
        except httpx.HTTPError as err:
            raise TeamUnavailable(f"the team server {self.name} cannot be reached: "
                                  f"{type(err).__name__}: {err}") from err
        if raw and resp.status_code == 200:
            return resp
        try:
            payload = resp.json()
        except ValueError as err:
            raise TeamUnavailable(f"the team server {self.name} answered HTTP {resp.status_code} "
                                  "with something that is not JSON") from err
        if resp.status_code != 200 or not payload.get("ok"):
            raise error_from(payload, resp.status_code)
        return payload["result"]

    # -- endpoints --------------------------------------------------------------------------
    def health(self) -> dict:
        return self.request("GET", "/v1/health")

    def me(self) -> dict:
        return self.request("GET", "/v1/me")

    def kbs(self) -> list[dict]:
        return self.request("GET", "/v1/kbs")["knowledge_bases"]

    def create_kb(self, name: str, *, privacy: str = "device", model: str | None = None,
                  default_access: str | None = None) -> dict:
        body = {"name": name, "privacy": privacy}
        if model:
            body["model"] = model
        if default_access is not None:
            body["default_access"] = default_access
        return self.request("POST", "/v1/kbs", json=body)["knowledge_base"]

    def search(self, kbs: list[str], query: str, **options: Any) -> dict:
        return self.request("POST", "/v1/search", json={"kbs": kbs, "query": query,
                                                        **{k: v for k, v in options.items()
                                                           if v is not None}})

    def sources(self, kb: str, *, offset: int = 0, limit: int = 100) -> dict:
        return self.request("GET", f"/v1/kbs/{_seg(kb)}/sources",
                            params={"offset": offset, "limit": limit})

    def add(self, kb: str, **fields: Any) -> dict:
        return self.request("POST", f"/v1/kbs/{_seg(kb)}/sources",
                            json={k: v for k, v in fields.items() if v is not None})

    def set_access(self, kb: str, source: str, access: str) -> dict:
        return self.request("PATCH", f"/v1/kbs/{_seg(kb)}/sources/{_seg(source)}", json={"access": access})

    def remove(self, kb: str, source: str) -> dict:
        return self.request("DELETE", f"/v1/kbs/{_seg(kb)}/sources/{_seg(source)}")

    def passages(self, kb: str, source: str, index: int, radius: int) -> list[dict]:
        return self.request("GET", f"/v1/kbs/{_seg(kb)}/passages",
                            params={"source": source, "index": index, "radius": radius})["passages"]

    def export(self, kb: str) -> tuple[bytes, dict]:
        resp = self.request("GET", f"/v1/kbs/{_seg(kb)}/export", raw=True)
        return resp.content, {k.lower(): v for k, v in resp.headers.items()}

    def import_(self, data: bytes, *, name: str | None = None, access: str | None = None) -> dict:
        params = {k: v for k, v in (("name", name), ("access", access)) if v is not None}
        return self.request("POST", "/v1/import", params=params, content=data)


    def chat(self, kbs: list[str], message: str, **options: Any) -> dict:
        """One team chat turn, answered as one JSON reply."""
        return self.request("POST", "/v1/chat", json={"kbs": kbs, "message": message, **options})

    def chat_stream(self, kbs: list[str], message: str, *, on_event=None, **options: Any) -> dict:
        """One team chat turn over Server-Sent Events: ``on_event(name, data)`` for each ``step``
        and ``token`` as it arrives; returns the ``result`` (an ``error`` event raises its error).

        The stream is read with the same SSE parser as a model's stream
        (``answer.llm.iter_sse_events``: CRLF, LF or CR line endings, split anywhere).
        """
        import json as _json

        from localkb.answer.llm import iter_sse_events

        body = {"kbs": kbs, "message": message, **options, "stream": True}
        try:
            with self._http.stream("POST", "/v1/chat", json=body,
                                   headers={"Accept": "text/event-stream"}) as resp:
                if resp.status_code != 200 or not resp.headers.get(
                        "content-type", "").startswith("text/event-stream"):
                    raw = resp.read()
                    try:
                        payload = _json.loads(raw)
                    except ValueError as err:
                        raise TeamUnavailable(f"the team server {self.name} answered HTTP "
                                              f"{resp.status_code} with something that is not "
                                              "JSON") from err
                    raise error_from(payload, resp.status_code)
                for data in iter_sse_events(resp.iter_raw()):
                    try:
                        frame = _json.loads(data)
                        name, value = frame["event"], frame["data"]
                    except (ValueError, KeyError, TypeError) as err:
                        raise TeamUnavailable(f"the team server {self.name} sent an event this "
                                              f"client cannot read ({err})") from err
                    if name == "result":
                        return value
                    if name == "error":
                        raise error_from({"error": value}, 200)
                    if on_event is not None:
                        on_event(name, value)
        except httpx.HTTPError as err:
            raise TeamUnavailable(f"the team server {self.name} cannot be reached or dropped the "
                                  f"stream: {type(err).__name__}: {err}") from err
        raise TeamUnavailable(f"the team server {self.name} ended the chat stream without a result")

    def querylog(self, *, user: str | None = None, offset: int = 0, limit: int = 50) -> dict:
        params = {"offset": offset, "limit": limit, **({"user": user} if user else {})}
        return self.request("GET", "/v1/querylog", params=params)

    def querylog_export(self, fmt: str = "jsonl", *, user: str | None = None) -> bytes:
        params = {"format": fmt, **({"user": user} if user else {})}
        return self.request("GET", "/v1/querylog/export", params=params, raw=True).content


def _seg(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")

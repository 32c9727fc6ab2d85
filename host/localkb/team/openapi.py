"""The team API as an OpenAPI 3.1 document, built from the server's route table (``GET /v1/openapi.json``).

Paths, methods, path parameters, which routes need a bearer token, and the one error
shape every failure has; bodies are described as JSON objects (the fields are in the
README's endpoint table and checked by each route).
"""

from __future__ import annotations

from typing import Any

ERROR = {"type": "object", "required": ["ok", "error"], "properties": {
    "ok": {"const": False},
    "error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"}, "detail": {"type": "object"}}}}}


def template(pattern: tuple[str, ...]) -> str:
    """``("v1", "kbs", "*", "sources")`` -> ``/v1/kbs/{kb}/sources`` (a wildcard named for its collection)."""
    parts = []
    for i, p in enumerate(pattern):
        if p == "*":
            before = pattern[i - 1] if i else ""
            parts.append("{" + ({"kbs": "kb", "sources": "source"}.get(before) or "name") + "}")
        else:
            parts.append(p)
    return "/" + "/".join(parts)


def document(routes, *, title: str, version: str) -> dict[str, Any]:
    paths: dict[str, dict] = {}
    for method, pattern, fn, auth in routes:
        path = template(pattern)
        op: dict[str, Any] = {
            "operationId": f"{method.lower()}_{fn.__name__.strip('_')}_{len(pattern)}",
            "summary": ((fn.__doc__ or "").strip().splitlines() or [fn.__name__])[0],
            "parameters": [{"name": p[1:-1], "in": "path", "required": True,
                            "schema": {"type": "string", "minLength": 1, "maxLength": 200}}
                           for p in path.split("/") if p.startswith("{")],
            "responses": {"200": {"description": "ok"},
                          "default": {"description": "an error", "content": {
                              "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
        }
        if auth:
            op["security"] = [{"bearer": []}]
        if method in ("POST", "PATCH", "PUT"):
            op["requestBody"] = {"required": False, "content": {
                "application/json": {"schema": {"type": "object"}}}}
        paths.setdefault(path, {})[method.lower()] = op
    return {"openapi": "3.1.0", "info": {"title": title, "version": version},
            "paths": paths,
            "components": {"schemas": {"Error": ERROR},
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}

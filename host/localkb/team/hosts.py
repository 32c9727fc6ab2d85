"""The names the team server answers to: the Host header checked before anything is routed.

A page on another site can make the browser resolve its own name to this machine (DNS
rebinding) and then read the answers as its own origin; the browser still sends that
name as the Host header. So a request is answered only when its Host names this server:
``localhost`` (and names under ``.localhost``, which browsers resolve to loopback
themselves), an IP address literal (an address cannot be rebound: a page reaching the
server by address has the address as its origin), or a name given with ``--allowed-host``
— with or without a port. Anything else is ``host_not_allowed`` (HTTP 421).

A request that changes something (any method but GET and HEAD) that carries an ``Origin``
header must come from a page on one of those names too (``origin_not_allowed``, 403); the
pipeline page is served from the server itself, and the Python client sends no Origin.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from localkb.errors import HostNotAllowed, InvalidInput, OriginNotAllowed

LOOPBACK_NAMES = ("localhost",)
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_SAFE_METHODS = ("GET", "HEAD")


def _name(host: str) -> str | None:
    """The name of a Host header or an Origin's authority, lower case, port and trailing dot off."""
    host = host.strip()
    if host.startswith("["):
        inside, sep, rest = host[1:].partition("]")
        if not sep or (rest and not re.fullmatch(r":\d{1,5}", rest)):
            return None
        try:
            return str(ipaddress.IPv6Address(inside))
        except ValueError:
            return None
    name, sep, port = host.partition(":")
    if sep and not re.fullmatch(r"\d{1,5}", port):
        return None
    name = name.lower().removesuffix(".")
    if not name or not all(_LABEL.match(label) for label in name.split(".")):
        return None
    return name


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostNames:
    """The host names this server answers to, beside loopback names and addresses."""

    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, names: Iterable[str]) -> HostNames:
        """``--allowed-host`` values (``team.example``, ``team.example:443``), checked."""
        out = set()
        for raw in names:
            name = _name(raw) if isinstance(raw, str) else None
            if name is None:
                raise InvalidInput(f"{raw!r} is not a host name (letters, digits, '-' and '.', or "
                                   "an IP address)", detail={"field": "allowed_host"})
            out.add(name)
        return cls(frozenset(out))

    def allows(self, host: str | None) -> bool:
        name = _name(host) if host else None
        if name is None:
            return False
        return (name in LOOPBACK_NAMES or name.endswith(".localhost") or _is_address(name)
                or name in self.names)

    def check(self, method: str, headers) -> None:
        """Raise unless the request names this server (and, if it writes, comes from a page on it)."""
        hosts = headers.get_all("Host") or []
        if len(hosts) != 1 or not self.allows(hosts[0]):
            raise HostNotAllowed(
                "this server does not answer to that host name; start it with --allowed-host NAME "
                "for a name of its own", detail={"host": (hosts[0] if hosts else "")[:200]})
        origin = headers.get("Origin")
        if origin is not None and method not in _SAFE_METHODS:
            parts = urlsplit(origin.strip())
            if parts.scheme not in ("http", "https") or not self.allows(parts.netloc):
                raise OriginNotAllowed("a page on another site may not send requests to this server",
                                       detail={"origin": origin[:200]})

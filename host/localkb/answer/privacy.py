"""The one decision of which knowledge bases may reach a model.

A knowledge base is ``device`` (the default: its text never leaves this machine) or ``cloud``.
A model endpoint is on-device only when its URL's host is loopback (127.0.0.0/8, ::1,
``localhost``) and the user has not marked it as forwarding to a cloud; anything else,
anything unparsable or unknown, and ``"auto"`` count as cloud. No endpoint at all
(extractive answers) is on-device. Every path that builds a prompt calls
``allowed_knowledge_bases`` and sends only what it allows.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import urlsplit

import httpx

from localkb.errors import PrivacyBlocked

Location = Literal["device", "cloud"]


class EndpointRef(Protocol):
    """What the gate reads of a model endpoint (``llm.Endpoint`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def base_url(self) -> str: ...

    @property
    def mark_cloud(self) -> bool: ...


class KBRef(Protocol):
    """Anything that names a knowledge base and its privacy (``"device"`` or ``"cloud"``)."""

    @property
    def id(self) -> object: ...

    @property
    def name(self) -> str: ...

    @property
    def privacy(self) -> str: ...


@dataclass(frozen=True)
class Skipped:
    """A knowledge base left out of a prompt, and why (shown to the user as is)."""

    kb: KBRef
    reason: str


@dataclass(frozen=True)
class GateResult:
    """The knowledge bases that may reach the endpoint, and those skipped with a reason."""

    allowed: list[KBRef] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _is_loopback_host(host: str) -> bool:
    host = host.lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        # A name other than localhost could resolve anywhere; only literal addresses count.
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 is loopback, but Python 3.11's is_loopback says no.
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _loopback_by_httpx(url: str) -> bool:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return False
    return (
        parsed.scheme in ("http", "https") and bool(parsed.host) and _is_loopback_host(parsed.host)
    )


def _loopback_by_urllib(url: str) -> bool:
    try:
        parsed = urlsplit(url)
        _ = parsed.port  # raises on a malformed port, which we count as unparsable
    except ValueError:
        return False
    host = parsed.hostname
    return parsed.scheme.lower() in ("http", "https") and bool(host) and _is_loopback_host(host)


def endpoint_location(endpoint: EndpointRef | None) -> Location:
    """``"device"`` when the endpoint is on this machine (or there is none), else ``"cloud"``."""
    if endpoint is None:
        return "device"
    if endpoint.mark_cloud:
        return "cloud"
    url = endpoint.base_url
    if not isinstance(url, str) or not url.strip():
        return "cloud"
    url = url.strip()
    # The client connects where httpx says; urllib is asked too so that a URL the two read
    # differently (userinfo tricks, odd brackets) is never taken for loopback.
    if _loopback_by_httpx(url) and _loopback_by_urllib(url):
        return "device"
    return "cloud"


def allowed_knowledge_bases(
    endpoint: EndpointRef | None, kbs: Sequence[KBRef], *, strict: bool = False
) -> GateResult:
    """Split ``kbs`` into those that may reach ``endpoint`` and those skipped, with reasons.

    A ``device`` knowledge base never reaches a cloud endpoint; a knowledge base whose privacy
    is anything but ``"cloud"`` is treated as ``device``. With ``strict`` a device knowledge
    base facing a cloud endpoint raises ``PrivacyBlocked`` instead of being skipped.
    """
    location = endpoint_location(endpoint)
    result = GateResult()
    blocked: list[KBRef] = []
    for kb in kbs:
        if location == "device" or kb.privacy == "cloud":
            result.allowed.append(kb)
            continue
        assert endpoint is not None  # a None endpoint is on-device
        blocked.append(kb)
        result.skipped.append(
            Skipped(kb=kb, reason=f"device only, {endpoint.name} is a cloud model")
        )
    if strict and blocked:
        assert endpoint is not None
        names = ", ".join(repr(kb.name) for kb in blocked)
        raise PrivacyBlocked(
            f"knowledge base{'s' if len(blocked) > 1 else ''} {names} "
            f"{'are' if len(blocked) > 1 else 'is'} device only and {endpoint.name} "
            "is a cloud model",
            detail={
                "endpoint": endpoint.name,
                "knowledge_bases": [
                    {"id": kb.id if isinstance(kb.id, (int, str)) else str(kb.id), "name": kb.name}
                    for kb in blocked
                ],
            },
        )
    return result

"""The one decision of which knowledge bases may reach a model.

A knowledge base is ``device`` (the default: its text never leaves this machine) or ``cloud``.
Where a model endpoint runs is decided by address, never by name: ``locate`` parses the URL the
way the HTTP client does, resolves its host when a request is made, and says ``"device"`` only
when every address it resolves to is loopback (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104) and the
user has not marked the endpoint as forwarding to a cloud. An address elsewhere makes it
``"cloud"``; a URL it cannot parse, a host that does not resolve (within ``RESOLVE_TIMEOUT_S``)
or ``"auto"`` leaves it undecided (``None``), and undecided is treated as cloud. The decision is
total: no input makes it raise. The HTTP client (``llm.py``) connects a device verdict only to
the addresses that were checked (see ``Placement``), so a name that resolves elsewhere later
(DNS rebinding) never receives what was gated for this machine.

No endpoint at all (extractive answers) is on-device. Every path that builds a prompt calls
``allowed_knowledge_bases`` and sends only what it allows.

Two destinations are not model endpoints, and the same function decides for them:

- A **team server** a turn is relayed to (``team_placement``): whatever its model, what the
  host sends it is kept in its query log and read by its administrators, so only text drawn
  wholly from that team's own knowledge bases goes back to it.
- Text whose provenance names no knowledge base of the store that reads it, on a store whose
  history comes **from another machine** (a team server's clients), is ``ELSEWHERE``: device-only
  text of a device this machine cannot vouch for, which reaches no model at all, not even one on
  this machine's loopback.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import httpx

from localkb.errors import PrivacyBlocked

Location = Literal["device", "cloud"]
#: The privacy of text that came from another machine and names none of this store's knowledge
#: bases: device only there, so no model here may receive it.
ELSEWHERE = "elsewhere"
#: How long a name may take to resolve before the location counts as undecided.
RESOLVE_TIMEOUT_S = 3.0


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


@dataclass(frozen=True)
class Placement:
    """Where an endpoint runs, decided once: the verdict and the addresses it was decided on.

    ``host`` and ``port`` are what the HTTP client connects to (the URL's host as the client
    encodes it); ``addresses`` every address that host resolved to. A ``"device"`` placement
    may be connected only to those addresses, each of them loopback.
    """

    location: Location | None
    host: str | None = None
    port: int | None = None
    addresses: tuple[str, ...] = ()
    reason: str = ""
    #: A relay to this attached team's server: only its own knowledge bases' text may go.
    team: str | None = None

    @property
    def on_device(self) -> bool:
        return self.location == "device"


def is_loopback_address(address: str) -> bool:
    """Whether an IP address (as ``getaddrinfo`` gives it) is this machine's loopback."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 is loopback, but Python 3.11's is_loopback says no.
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def endpoint_target(url: object) -> tuple[str, int] | str:
    """(host, port) the HTTP client would connect to, or why there is none."""
    if not isinstance(url, str) or not url.strip():
        return "no base URL"
    try:
        parsed = httpx.URL(url.strip())
        scheme = parsed.scheme
        host = parsed.raw_host.decode("ascii")
        _ = parsed.host  # decoding the IDNA form can fail where the raw form did not
        port = parsed.port or (443 if scheme == "https" else 80)
    except Exception:
        return "the URL cannot be parsed"
    if scheme not in ("http", "https"):
        return "the URL is not http:// or https://"
    if not host:
        return "the URL has no host"
    if not 0 < port < 65536:
        return "the URL's port is out of range"
    return host, port


def _resolve(host: str, port: int, timeout: float) -> tuple[str, ...] | None:
    """Every address ``host`` resolves to, or None when it does not (in time)."""
    literal = host[1:-1] if host.startswith("[") else host
    try:
        return (str(ipaddress.ip_address(literal)),)
    except ValueError:
        pass
    answer: list = []

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            answer.append(tuple(dict.fromkeys(str(i[4][0]) for i in infos)))
        except (OSError, UnicodeError, ValueError):
            answer.append(None)

    # getaddrinfo has no timeout of its own; a dead DNS server must not hold a chat turn.
    thread = threading.Thread(target=lookup, name="localkb-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer and answer[0] else None


def locate(endpoint: EndpointRef | None, *, timeout: float = RESOLVE_TIMEOUT_S) -> Placement:
    """Where ``endpoint`` runs, decided now by the addresses its host resolves to (total)."""
    if endpoint is None:
        return Placement("device", reason="no model: answers are quoted passages")
    try:
        if endpoint.mark_cloud:
            return Placement("cloud", reason="marked as forwarding to a cloud model")
        target = endpoint_target(endpoint.base_url)
        if isinstance(target, str):
            return Placement(None, reason=target)
        host, port = target
        addresses = _resolve(host, port, timeout)
        if addresses is None:
            return Placement(None, host, port, reason=f"{host} does not resolve")
        off = [a for a in addresses if not is_loopback_address(a)]
        if off:
            return Placement("cloud", host, port, addresses, f"{host} resolves to {off[0]}")
        return Placement("device", host, port, addresses, f"{host} resolves to loopback only")
    except Exception as err:
        return Placement(None, reason=f"undecidable: {type(err).__name__}")


def team_placement(team: str) -> Placement:
    """The decision for a turn relayed to the team server ``team`` (never this device)."""
    return Placement("cloud", reason=f"the team server {team} keeps what it is sent", team=team)


def endpoint_location(endpoint: EndpointRef | None) -> Location | None:
    """``"device"``, ``"cloud"``, or ``None`` when it cannot be decided (treated as cloud)."""
    return locate(endpoint).location


def _where(endpoint: EndpointRef | None, placement: Placement) -> str:
    if placement.team is not None:
        return f"the team server {placement.team} holds only its own knowledge bases' text"
    name = endpoint.name if endpoint is not None else "the model"
    if placement.location == "cloud":
        return f"{name} is a cloud model"
    return f"where {name} runs is unknown (treated as cloud)"


def _may_reach(kb: KBRef, placement: Placement) -> bool:
    if kb.privacy == ELSEWHERE:
        return False
    if placement.team is not None:
        # A team knowledge base's record names its team (``TeamRecord.team``); a local one none.
        return getattr(kb, "team", None) == placement.team
    return placement.on_device or kb.privacy == "cloud"


def _reason(kb: KBRef, endpoint: EndpointRef | None, placement: Placement) -> str:
    if kb.privacy == ELSEWHERE:
        return "written on another machine from knowledge bases this server does not hold"
    if placement.team is not None and kb.privacy == "cloud":
        return f"not a knowledge base of the team {placement.team}"
    return f"device only, {_where(endpoint, placement)}"


def allowed_knowledge_bases(
    endpoint: EndpointRef | None,
    kbs: Sequence[KBRef],
    *,
    strict: bool = False,
    placement: Placement | None = None,
) -> GateResult:
    """Split ``kbs`` into those that may reach ``endpoint`` and those skipped, with reasons.

    A ``device`` knowledge base reaches only an on-device endpoint; a knowledge base whose
    privacy is anything but ``"cloud"`` is treated as ``device``; an ``ELSEWHERE`` one reaches
    nothing; a ``team_placement`` takes only that team's knowledge bases. ``placement`` is the decision
    already made for this request (``locate`` is asked when it is not given). With ``strict`` a
    device knowledge base facing a cloud endpoint raises ``PrivacyBlocked`` instead of being
    skipped.
    """
    placement = placement if placement is not None else locate(endpoint)
    result = GateResult()
    blocked: list[KBRef] = []
    for kb in kbs:
        if _may_reach(kb, placement):
            result.allowed.append(kb)
            continue
        blocked.append(kb)
        result.skipped.append(Skipped(kb=kb, reason=_reason(kb, endpoint, placement)))
    if strict and blocked:
        names = ", ".join(repr(kb.name) for kb in blocked)
        raise PrivacyBlocked(
            f"knowledge base{'s' if len(blocked) > 1 else ''} {names} "
            f"{'are' if len(blocked) > 1 else 'is'} device only and "
            f"{_where(endpoint, placement)}",
            detail={
                "endpoint": endpoint.name if endpoint is not None else placement.team,
                "location": placement.location,
                "knowledge_bases": [
                    {"id": kb.id if isinstance(kb.id, (int, str)) else str(kb.id), "name": kb.name}
                    for kb in blocked
                ],
            },
        )
    return result

"""The client's address behind TLS proxies the operator trusts (``--trusted-proxy CIDR``).

A server behind a proxy sees the proxy's address on every socket, so a per-address cap would
count everyone together. ``X-Forwarded-For`` names the addresses a request passed through, but
any client can write one: only the part that trusted proxies appended is believed. Read from
the right, each address a trusted proxy vouches for is skipped; the first one that is not a
trusted proxy is the client (the rightmost untrusted address, as nginx's ``real_ip_recursive``
does). With no trusted proxy, or from a peer that is not one, the header is ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from localkb.errors import InvalidInput

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """The trusted proxies' networks, or ``InvalidInput`` naming the one that is not a network."""
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise InvalidInput(f"--trusted-proxy {cidr!r} is not an address or a network (10.0.0.0/8)",
                               detail={"field": "trusted_proxy"}) from None
    return tuple(out)


def _trusted(address: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in trusted)


def client_address(peer: str, forwarded_for: list[str] | None, trusted: tuple[Network, ...]) -> str:
    """The address a request is counted and logged as."""
    if not trusted or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for value in forwarded_for or () for h in value.split(",") if h.strip()]
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop.strip("[]"))
        except ValueError:
            return peer  # a hop that is no address: nothing past it can be believed
        if not _trusted(hop, trusted):
            return hop.strip("[]")
    return hops[0].strip("[]") if hops else peer

"""Where a webhook may be sent: public addresses only, unless the operator allows more.

A receiver's URL names a host; the worker must not become a way into the operator's own
network (the cloud metadata service, the database, Redis, an admin page on loopback). So
an address that is loopback, link-local, private, unspecified, multicast, reserved or
otherwise not globally routable is refused, unless it lies in one of the networks of the
operator's allow-list (``IDEMPAY_WEBHOOK_ALLOW_PRIVATE``, comma-separated CIDRs).

The rule is applied twice: when an endpoint is added (its host, resolved, or as written
when it is an address in any spelling ``getaddrinfo`` accepts: ``2130706433``, ``0x7f.1``)
and at every attempt, to every address the host resolves to then; the attempt connects to
an address it checked, never resolving the name again (a name that resolved to a public
address at add time and to ``127.0.0.1`` later is refused).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port → the addresses it resolves to, as text (raises OSError when it does not)
Resolver: TypeAlias = Callable[[str, int], Awaitable[list[str]]]

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Ranges Python's ``is_global`` still calls global that no public receiver lives in: IPv6
# site-local (deprecated, RFC 3879: routed inside a site), the IETF protocol assignments
# (192.0.0.0/24: only .9 and .10 are globally reachable, and no webhook receiver is), and
# the 6to4 relay anycast (deprecated, RFC 7526).
_NOT_PUBLIC = (
    ipaddress.IPv6Network("fec0::/10"),
    ipaddress.IPv4Network("192.0.0.0/24"),
    ipaddress.IPv4Network("192.88.99.0/24"),
)
_ADD_RESOLVE_TIMEOUT = 5.0


class RefusedDestinationError(ValueError):
    """The URL's host is, or resolves to, an address webhooks may not be sent to."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """``"10.0.0.0/8, ::1"`` → networks; ValueError on anything that is not one."""
    networks = []
    for item in text.split(","):
        if item.strip():
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
    return tuple(networks)


@dataclass(frozen=True, slots=True)
class AllowList:
    """Networks the operator allows although they are not public (empty: none)."""

    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AllowList:
        return cls(parse_networks(text))

    @classmethod
    def from_settings(cls) -> AllowList:
        from api.config import Settings

        return cls.parse(Settings().webhook_allow_private)

    def allows(self, address: Address) -> bool:
        return any(
            address in network for network in self.networks if network.version == address.version
        )


def _embedded(address: Address) -> Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), if any."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def _why_not_public(address: Address) -> str | None:
    for kind in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global or any(
        address.version == net.version and address in net for net in _NOT_PUBLIC
    ):
        return "not global"
    return None


def refusal(address: Address, allow: AllowList) -> str | None:
    """Why a webhook may not go to ``address`` (None: it may)."""
    candidates = [address]
    inner = _embedded(address)
    if inner is not None:
        candidates.append(inner)
    for candidate in candidates:
        why = _why_not_public(candidate)
        if why is not None and not (allow.allows(address) or allow.allows(candidate)):
            return f"{address} is {why} (allow it with IDEMPAY_WEBHOOK_ALLOW_PRIVATE)"
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _judge(host: str, addresses: Iterable[str], allow: AllowList) -> list[Address]:
    checked = []
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # no IPv6 zone
        why = refusal(address, allow)
        if why is not None:
            raise RefusedDestinationError(f"refused destination {host!r}: {why}")
        checked.append(address)
    if not checked:
        raise RefusedDestinationError(f"refused destination {host!r}: it resolves to nothing")
    return checked


async def resolve(host: str, port: int, allow: AllowList, resolver: Resolver) -> list[Address]:
    """Every address ``host`` resolves to, each allowed, or RefusedDestinationError (or an
    OSError when it does not resolve)."""
    return _judge(host, await resolver(host, port), allow)


async def check_at_add(host: str, port: int, allow: AllowList, resolver: Resolver) -> None:
    """Refuse a host that is, or now resolves to, an address not allowed. A name that does
    not resolve yet is accepted: every attempt judges it again."""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        _judge(host, [str(literal)], allow)
        return
    try:
        async with asyncio.timeout(_ADD_RESOLVE_TIMEOUT):
            addresses = await resolver(host, port)
    except (OSError, TimeoutError, UnicodeError):
        return
    _judge(host, addresses, allow)

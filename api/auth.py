"""API keys: ``idp_`` + 43 url-safe characters, stored only as sha256, compared in constant
time, cached in memory for a minute (a revoked key stops working within that minute).

The merchant's settings the create needs — its duplicate-guard window (``merchant.
duplicate_guard_s``, ``idempay admin guard``) — come with the key, in the same query and the
same cache entry: no round trip per request, and a changed setting takes effect in each
worker within that same minute.

Failed authentications are limited per client address (``IDEMPAY_AUTH_FAILURE_LIMIT``,
``AuthFailureLimiter``). Every key is checked; only a failure is counted, and once an
address is over the limit its failures answer 429 instead of 401. A valid key is never
refused because of its address: not after a restart, not on a new worker, not for a merchant
whose key was never used before — terminals of every merchant that share an address with an
attacker (a carrier-grade NAT, a proxy) keep working. Every failure under the limit answers
the same 401 body: a malformed, unknown or revoked key look alike.

The client address is an IP address (an IPv6 client stands for its /64, the block one
subscriber gets); a value that is not an IP address (a forged X-Forwarded-For) is not an
identity, and all such values share one bucket.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from api.config import Settings
from api.db import atomic, utcnow
from api.errors import ApiError
from api.models import ApiKey, Merchant
from api.ratelimit import AuthFailureLimiter, rate_limited

CACHE_SECONDS = 60.0
UNPARSEABLE_ADDRESS = "unparseable"


def unauthorized() -> ApiError:
    """A new 401 each time: one shared exception object raised again and again would keep
    every failed request's frames alive through its ever-growing ``__traceback__``."""
    return ApiError(
        401,
        "unauthorized",
        "Send Authorization: Bearer <api key>.",
        headers={"WWW-Authenticate": "Bearer"},
    )


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def _digest_of(authorization: str | None) -> str | None:
    """sha256 of the bearer key, or None when the header cannot hold one."""
    # RFC 9110 §11.1: the scheme name is case-insensitive ("bearer", "BEARER").
    if not authorization or authorization[:7].lower() != "bearer ":
        return None
    api_key = authorization[7:].strip()
    if not api_key or len(api_key) > 200:
        return None
    return hash_key(api_key)


def failure_limiter(settings: Settings) -> AuthFailureLimiter:
    return AuthFailureLimiter(
        limit=settings.auth_failure_limit,
        redis_url=settings.redis_url,
        prefix=f"{settings.redis_prefix}af",
    )


def client_address(request: Request) -> str:
    """The peer as uvicorn reports it (X-Forwarded-For is honoured only from the proxies in
    uvicorn's FORWARDED_ALLOW_IPS, default 127.0.0.1), as an IP address: IPv4 as is, IPv6 as
    its /64 (an IPv4-mapped IPv6 address as the IPv4 address); anything else is ignored —
    every such value is the one ``UNPARSEABLE_ADDRESS``, so a rotating forged header is one
    identity, and no client-chosen string is ever kept."""
    host = request.client.host if request.client else ""
    try:
        address = ipaddress.ip_address(host.strip())
    except ValueError:
        return UNPARSEABLE_ADDRESS
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a valid API key speaks for, with the merchant's settings the create reads."""

    merchant_id: str
    duplicate_guard_s: int | None = None  # the guard's window; None: off


class Authenticator:
    def __init__(self, engine: AsyncEngine, *, failures: AuthFailureLimiter | None = None) -> None:
        self._engine = engine
        self._cache: dict[str, tuple[Principal, float]] = {}
        self.failures = failures

    async def authenticate(self, request: Request) -> tuple[str, str]:
        """(merchant_id, key_hash) for the request; else 401 — or 429 once the client address
        is over the failed-authentication limit. A valid key always authenticates."""
        principal, digest = await self.principal(request)
        return principal.merchant_id, digest

    async def principal(self, request: Request) -> tuple[Principal, str]:
        """``authenticate``, with the merchant's settings (the create's duplicate guard)."""
        if self.failures is None:  # built from the app's settings on first use
            self.failures = failure_limiter(request.app.state.ctx.settings)
        try:
            return await self._principal_of(request.headers.get("authorization"))
        except ApiError:
            retry_after = await self.failures.failed(client_address(request))
            if retry_after is not None:
                raise rate_limited(self.failures.item, retry_after) from None
            raise

    async def merchant_for(self, authorization: str | None) -> tuple[str, str]:
        """(merchant_id, key_hash) for a ``Bearer`` header, or raise 401."""
        principal, digest = await self._principal_of(authorization)
        return principal.merchant_id, digest

    async def _principal_of(self, authorization: str | None) -> tuple[Principal, str]:
        digest = _digest_of(authorization)
        if digest is None:
            raise unauthorized()
        return await self._principal_for(digest), digest

    async def _principal_for(self, digest: str) -> Principal:
        cached = self._cache.get(digest)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(ApiKey.merchant_id, ApiKey.key_hash, Merchant.duplicate_guard_s)
                    .join(Merchant, Merchant.id == ApiKey.merchant_id)
                    .where(ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None))
                )
            ).first()
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            raise unauthorized()
        if len(self._cache) > 10_000:
            self._cache.clear()
        principal = Principal(str(row.merchant_id), row.duplicate_guard_s)
        self._cache[digest] = (principal, time.monotonic() + CACHE_SECONDS)
        return principal


async def create_api_key(engine: AsyncEngine, merchant: str) -> str:
    """Create (or reuse) the merchant named ``merchant`` and a new API key for it."""
    api_key = "idp_" + secrets.token_urlsafe(32)
    now = utcnow()
    async with atomic(engine) as conn:
        merchant_id = (
            await conn.execute(select(Merchant.id).where(Merchant.name == merchant))
        ).scalar_one_or_none()
        if merchant_id is None:
            merchant_id = "mer_" + uuid.uuid4().hex[:20]
            await conn.execute(
                insert(Merchant).values(id=merchant_id, name=merchant, created_at=now)
            )
        await conn.execute(
            insert(ApiKey).values(
                id="key_" + uuid.uuid4().hex[:20],
                merchant_id=merchant_id,
                key_hash=hash_key(api_key),
                prefix=api_key[:8],
                created_at=now,
            )
        )
    return api_key


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What may be shown about an API key: never the key, only its first 8 characters."""

    id: str
    merchant: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


async def list_api_keys(engine: AsyncEngine, merchant: str | None = None) -> list[KeyInfo]:
    query = (
        select(ApiKey.id, Merchant.name, ApiKey.prefix, ApiKey.created_at, ApiKey.revoked_at)
        .join(Merchant, Merchant.id == ApiKey.merchant_id)
        .order_by(Merchant.name, ApiKey.created_at)
    )
    if merchant is not None:
        query = query.where(Merchant.name == merchant)
    async with engine.connect() as conn:
        return [KeyInfo(*row) for row in (await conn.execute(query)).all()]


async def revoke_api_key(
    engine: AsyncEngine, *, prefix: str, merchant: str | None = None
) -> list[KeyInfo]:
    """Revoke the one active key named by ``prefix``: its key id, its first 8 characters, or
    the whole key (then checked against the stored hash) — of ``merchant``, if given. Several
    matches revoke nothing: the caller must be more specific. Returns the active keys that
    matched (revoked when there was exactly one). An already revoked key matches nothing."""
    whole = hash_key(prefix) if len(prefix) > 8 else None
    query = (
        select(ApiKey.id, ApiKey.key_hash)
        .join(Merchant, Merchant.id == ApiKey.merchant_id)
        .where(ApiKey.revoked_at.is_(None))
    )
    if merchant is not None:
        query = query.where(Merchant.name == merchant)
    async with engine.connect() as conn:
        hashes = dict((await conn.execute(query)).all())
    keys = {key.id: key for key in await list_api_keys(engine, merchant)}
    matches = [
        keys[key_id]
        for key_id, key_hash in hashes.items()
        if key_id == prefix
        or (whole is None and keys[key_id].prefix == prefix)
        or (whole is not None and hmac.compare_digest(key_hash, whole))
    ]
    if len(matches) == 1:
        async with atomic(engine) as conn:
            await conn.execute(
                update(ApiKey)
                .where(ApiKey.id == matches[0].id, ApiKey.revoked_at.is_(None))
                .values(revoked_at=utcnow())
            )
    return matches

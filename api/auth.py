"""API keys: ``idp_`` + 43 url-safe characters, stored only as sha256, compared in constant
time, cached in memory for a minute (a revoked key stops working within that minute).

Failed authentications are limited per client address (``IDEMPAY_AUTH_FAILURE_LIMIT``,
``AuthFailureLimiter``). While an address is over the limit, only keys this process has
already seen authenticate are checked; every other request from it answers 429 without a key
check, so guessing is capped at about ``limit`` tries per window per address, while terminals
of known merchants that share the address (a carrier-grade NAT, a proxy) keep working. Every
failure answers the same 401 body: a malformed, unknown or revoked key look alike.
"""

from __future__ import annotations

import hashlib
import hmac
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
KNOWN_GOOD_MAX = 100_000
UNAUTHORIZED = ApiError(
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
    uvicorn's FORWARDED_ALLOW_IPS, default 127.0.0.1)."""
    return request.client.host if request.client else "unknown"


class Authenticator:
    def __init__(self, engine: AsyncEngine, *, failures: AuthFailureLimiter | None = None) -> None:
        self._engine = engine
        self._cache: dict[str, tuple[str, float]] = {}
        self._failures = failures
        # sha256 of keys that authenticated in this process (a bounded, oldest-first set):
        # the only keys still checked for an address that is over the failure limit.
        self._known_good: dict[str, None] = {}

    async def authenticate(self, request: Request) -> tuple[str, str]:
        """(merchant_id, key_hash) for the request, or 401 — or 429 for an address over the
        failed-authentication limit presenting a key this process has not seen succeed."""
        if self._failures is None:  # built from the app's settings on first use
            self._failures = failure_limiter(request.app.state.ctx.settings)
        digest = _digest_of(request.headers.get("authorization"))  # hashed once per request
        known = digest in self._known_good  # the usual request: no limiter round trip
        client = client_address(request)
        if not known:
            retry_after = await self._failures.blocked(client)
            if retry_after is not None:
                raise rate_limited(self._failures.item, retry_after)
        try:
            if digest is None:
                raise UNAUTHORIZED
            merchant_id = await self._merchant_for(digest)
        except ApiError:
            await self._failures.failed(client)
            raise
        if not known:
            if len(self._known_good) >= KNOWN_GOOD_MAX:
                del self._known_good[next(iter(self._known_good))]
            self._known_good[digest] = None
        return merchant_id, digest

    async def merchant_for(self, authorization: str | None) -> tuple[str, str]:
        """(merchant_id, key_hash) for a ``Bearer`` header, or raise 401."""
        digest = _digest_of(authorization)
        if digest is None:
            raise UNAUTHORIZED
        return await self._merchant_for(digest), digest

    async def _merchant_for(self, digest: str) -> str:
        cached = self._cache.get(digest)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(ApiKey.merchant_id, ApiKey.key_hash).where(
                        ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None)
                    )
                )
            ).first()
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            raise UNAUTHORIZED
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (row.merchant_id, time.monotonic() + CACHE_SECONDS)
        return str(row.merchant_id)


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

"""API keys: ``idp_`` + 43 url-safe characters, stored only as sha256, compared in constant
time, cached in memory for a minute (a revoked key stops working within that minute)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic, utcnow
from api.errors import ApiError
from api.models import ApiKey, Merchant

CACHE_SECONDS = 60.0
UNAUTHORIZED = ApiError(
    401,
    "unauthorized",
    "Send Authorization: Bearer <api key>.",
    headers={"WWW-Authenticate": "Bearer"},
)


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class Authenticator:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._cache: dict[str, tuple[str, float]] = {}

    async def merchant_for(self, authorization: str | None) -> tuple[str, str]:
        """(merchant_id, key_hash) for a ``Bearer`` header, or raise 401."""
        if not authorization or not authorization.startswith("Bearer "):
            raise UNAUTHORIZED
        api_key = authorization[len("Bearer ") :].strip()
        if not api_key or len(api_key) > 200:
            raise UNAUTHORIZED
        digest = hash_key(api_key)
        cached = self._cache.get(digest)
        if cached and cached[1] > time.monotonic():
            return cached[0], digest
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
        return row.merchant_id, digest


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

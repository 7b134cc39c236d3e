"""The failover harness's checks, run against whichever node is primary at the end (the
multi-host URL with ``target_session_attrs=read-write`` finds it): contract §8's invariants
(``idempay_tools.invariants``) for the fleet and the probe, the outbox relayed without a
gap in any merchant's ``seq``, and the 5xx answers the server logged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from idempay_tools.invariants import InvariantReport


@dataclass(frozen=True)
class Outbox:
    events: int
    unsent: int
    seq_gaps: int  # per merchant: max(seq) − count(distinct seq), summed

    @property
    def ok(self) -> bool:
        return self.unsent == 0 and self.seq_gaps == 0


@dataclass(frozen=True)
class FailoverChecks:
    fleet: InvariantReport
    probe: InvariantReport
    outbox: Outbox
    status_5xx: dict[int, int]
    served_by: str  # host:port of the primary the checks read

    @property
    def ok(self) -> bool:
        return self.fleet.ok and self.probe.ok and self.outbox.ok and 500 not in self.status_5xx


async def check(
    database_url: str,
    *,
    merchants: list[str],
    probe: str,
    reported: dict[str, str],
    journals: Sequence[Path],
) -> FailoverChecks:
    from sqlalchemy import text

    from api.config import Settings
    from api.db import create_engine
    from api.models import OutboxEvent, RequestEvent
    from idempay_tools.invariants import check_invariants

    engine = create_engine(Settings(database_url=database_url))
    try:
        fleet = await check_invariants(
            engine, merchant_ids=merchants, reported=reported, journals=journals
        )
        probed = await check_invariants(engine, merchant_ids=[probe])
        everyone = [*merchants, probe]
        async with engine.connect() as conn:
            served = await conn.execute(text("SELECT inet_server_port()"))
            rows = await conn.execute(
                select(
                    OutboxEvent.merchant_id,
                    func.count(),
                    func.count(OutboxEvent.sent_at),
                    func.coalesce(func.max(OutboxEvent.seq), 0),
                    func.count(func.distinct(OutboxEvent.seq)),
                )
                .where(OutboxEvent.merchant_id.in_(everyone))
                .group_by(OutboxEvent.merchant_id)
            )
            per_merchant = [tuple(int(value or 0) for value in row[1:]) for row in rows.all()]
            fives = await conn.execute(
                select(RequestEvent.http_status, func.count())
                .where(RequestEvent.merchant_id.in_(everyone), RequestEvent.http_status >= 500)
                .group_by(RequestEvent.http_status)
            )
            status_5xx = {int(status): int(count) for status, count in fives.all()}
            port = served.scalar_one()
    finally:
        await engine.dispose()
    outbox = Outbox(
        events=sum(r[0] for r in per_merchant),
        unsent=sum(r[0] - r[1] for r in per_merchant),
        seq_gaps=sum(r[2] - r[3] for r in per_merchant),
    )
    return FailoverChecks(fleet, probed, outbox, status_5xx, f"127.0.0.1:{port}")

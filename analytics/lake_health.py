"""What the audit found wrong with the lake it read (issue 22, item 6).

The audit reads only ``event_date=YYYY-MM-DD`` partitions and says, rather than silently
absorbing, when the lake is damaged: a stray directory (``event_date=D.bak/``) it skipped, a
partition without a manifest or whose files differ from it, a file lacking a contract
column (read as null), duplicate rows it dropped, a day with transactions but no request
events. Each finding is one row of ``lake_warnings`` (``kind``, ``table``, ``event_date``,
``detail``); they go to stdout, ``lake_warnings.csv`` and the top of report.html, and
``--strict`` turns any of them into a non-zero exit.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from analytics import manifest

PARTITION = re.compile(r"event_date=(\d{4}-\d{2}-\d{2})")
COLUMNS = ["kind", "table", "event_date", "detail"]


@dataclass
class LakeHealth:
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, table: str, day: str | None, detail: str) -> None:
        self.warnings.append({"kind": kind, "table": table, "event_date": day, "detail": detail})


def _partition_day(folder: Path) -> date | None:
    match = PARTITION.fullmatch(folder.name)
    if match is None:
        return None
    try:
        return date.fromisoformat(match.group(1))
    except ValueError:
        return None


def partitions(root: Path, table: str, health: LakeHealth) -> Iterator[tuple[date, Path]]:
    """The table's ``event_date=YYYY-MM-DD`` directories; anything else is reported."""
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue  # temporaries, locks, markers
        day = _partition_day(entry) if entry.is_dir() else None
        if day is None:
            health.add("ignored_path", table, None, f"{entry.name} is not a partition: not read")
            continue
        yield day, entry


def data_files(
    root: Path, table: str, contract: list[str], health: LakeHealth
) -> dict[str, list[str]]:
    """Parquet files of the valid partitions, grouped by physical schema; each partition's
    manifest checked and each file's missing contract columns reported."""
    groups: dict[str, list[str]] = {}
    for day, folder in partitions(root, table, health):
        for problem in manifest.problems(folder, columns=contract):
            health.add("manifest", table, day.isoformat(), problem)
        for found in sorted(folder.glob("*.parquet")):
            if found.name.startswith((".", "_")):
                continue
            schema = pq.read_schema(found).remove_metadata()
            missing = [name for name in contract if name not in schema.names]
            if missing:
                detail = f"{found.name} lacks {', '.join(missing)}: read as null"
                health.add("missing_column", table, day.isoformat(), detail)
            groups.setdefault(schema.to_string(), []).append(str(found))
    return groups


def days_without_events(
    transactions_per_day: dict[str, int], events_per_day: dict[str, int], health: LakeHealth
) -> None:
    for day, count in sorted(transactions_per_day.items()):
        if count and not events_per_day.get(day):
            health.add(
                "no_events",
                "request_events",
                day,
                f"{count} transactions but no request events: every event metric of the day"
                " is missing (was the events partition lost or exported empty?)",
            )

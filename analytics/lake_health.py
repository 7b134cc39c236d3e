"""What the audit found wrong with the lake it read (issue 22, item 6).

The audit reads only ``event_date=YYYY-MM-DD`` partitions and says, rather than silently
absorbing, when the lake is damaged: a stray directory (``event_date=D.bak/``) it skipped, a
partition without a manifest or whose files differ from it, a file lacking a contract
column (read as null), duplicate rows it dropped, a day with transactions but no request
events. Each finding is one row of ``lake_warnings`` (``kind``, ``table``, ``event_date``,
``detail``); they go to stdout, ``lake_warnings.csv`` and the top of report.html, and
``--strict`` turns any of them into a non-zero exit.

A file written before a column was added to the lake (``analytics.lake.ADDED_COLUMNS``:
the offline and duplicate-guard columns of lake schema 2, the acquirer's rrn,
authorization_code and decline_reason of lake schema 3) is not damaged: it is read with
those columns null, and that is said as a **note** (kind ``older_schema``, same columns,
``lake_notes.csv``, the report), never a warning: ``--strict`` does not fail on it.
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
    notes: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, table: str, day: str | None, detail: str) -> None:
        self.warnings.append({"kind": kind, "table": table, "event_date": day, "detail": detail})

    def note(self, kind: str, table: str, day: str | None, detail: str) -> None:
        """Something the reader should know that is not damage (``--strict`` ignores it)."""
        self.notes.append({"kind": kind, "table": table, "event_date": day, "detail": detail})


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
    root: Path,
    table: str,
    columns: list[str],
    health: LakeHealth,
    *,
    added: list[str] | None = None,
) -> dict[str, list[str]]:
    """Parquet files of the valid partitions, grouped by physical schema; each partition's
    manifest checked and each file's missing columns reported: a contract column as a
    warning, a column of ``added`` (newer than lake schema 1) as an ``older_schema`` note."""
    added = added or []
    groups: dict[str, list[str]] = {}
    for day, folder in partitions(root, table, health):
        for problem in manifest.problems(folder, columns=columns, added=added):
            health.add("manifest", table, day.isoformat(), problem)
        for found in sorted(folder.glob("*.parquet")):
            if found.name.startswith((".", "_")):
                continue
            schema = pq.read_schema(found).remove_metadata()
            missing = [name for name in columns if name not in schema.names]
            lacking = [name for name in missing if name not in added]
            if lacking:
                detail = f"{found.name} lacks {', '.join(lacking)}: read as null"
                health.add("missing_column", table, day.isoformat(), detail)
            older = [name for name in missing if name in added]
            if older:
                detail = f"{found.name} " + "; ".join(_predates(older))
                health.note("older_schema", table, day.isoformat(), detail)
            groups.setdefault(schema.to_string(), []).append(str(found))
    return groups


# What a figure means when a file predates the columns of a lake schema version.
_WITHOUT = {
    2: "read as null, counted as false — the day's offline and override figures are 0 by"
    " construction, not measured",
    3: "read as null — the day's approved transactions are not reconcilable with the"
    " acquirer's clearing file, and its acquirer_timeouts are 0 by construction",
}


def _predates(older: list[str]) -> list[str]:
    by_version: dict[int, list[str]] = {}
    for name in older:
        by_version.setdefault(manifest.ADDED_IN.get(name, 2), []).append(name)
    return [
        f"predates {', '.join(names)} (written before lake schema {version}): {_WITHOUT[version]}"
        for version, names in sorted(by_version.items())
    ]


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

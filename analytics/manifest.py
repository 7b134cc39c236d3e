"""A partition's manifest: what the writer put in the partition, so a reader can tell a
complete, intact day from a missing, partial or altered one.

Each ``event_date=YYYY-MM-DD/`` directory written by ``analytics.lake.write_partition``
holds, besides its Parquet file, ``_manifest.json`` (table, day, schema version, columns,
and per file its rows, bytes and SHA-256) and an empty ``_SUCCESS`` written last. Names
starting with ``_`` are skipped by Spark and DuckDB as data.

A partition written by ``analytics.synth`` also holds ``_SYNTHESIZED`` (who made it up):
the day is not real traffic, and the report says so (``synthesized_days``). A re-export of
the day replaces the partition's files and removes any other (``analytics.lake``), marker
included, so a day the server's rows were merged into is real again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

# 1: the contract's columns (contract §5.1); 2: transactions gains offline, captured_at and
# duplicate_override; 3: transactions gains rrn, authorization_code and decline_reason, and
# the lake gains the clearing table. A partition of an older version is intact when its
# columns are the contract's without the ones added since (``analytics.lake.ADDED_COLUMNS``,
# each added in the version ``ADDED_IN`` says).
SCHEMA_VERSION = 3
ADDED_IN = {
    "offline": 2,
    "captured_at": 2,
    "duplicate_override": 2,
    "rrn": 3,
    "authorization_code": 3,
    "decline_reason": 3,
}
MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"
SYNTHESIZED = "_SYNTHESIZED"
DAY_TABLES = ("request_events", "transactions", "ledger_entries")


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    rows: int
    bytes: int
    sha256: str


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def describe(path: Path, rows: int) -> FileEntry:
    return FileEntry(path.name, rows, path.stat().st_size, sha256_of(path))


def render(
    table: str,
    day: date,
    columns: list[str],
    files: list[FileEntry],
    *,
    extra: dict[str, Any] | None = None,
) -> str:
    """The manifest's text; ``extra``: what else the writer vouches for (a clearing
    partition's trailer and source file)."""
    body: dict[str, Any] = {
        **(extra or {}),
        "table": table,
        "event_date": day.isoformat(),
        "schema_version": SCHEMA_VERSION,
        "columns": columns,
        "rows": sum(f.rows for f in files),
        "files": [
            {"name": f.name, "rows": f.rows, "bytes": f.bytes, "sha256": f.sha256} for f in files
        ],
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def problems(partition: Path, *, columns: list[str], added: list[str] | None = None) -> list[str]:
    """What is wrong with ``partition`` as its writer described it; [] when it is intact.

    ``columns``: the table's columns at ``SCHEMA_VERSION``; ``added``: those added after
    version 1, which a manifest of a version older than theirs (``ADDED_IN``) rightly
    lacks."""
    manifest = partition / MANIFEST
    if not manifest.is_file():
        return ["manifest missing (the partition was not written by idempay export/synth)"]
    try:
        body = json.loads(manifest.read_text(encoding="utf-8"))
        files = {f["name"]: f for f in body["files"]}
        version = int(body["schema_version"])
    except (ValueError, KeyError, TypeError) as exc:
        return [f"manifest unreadable ({type(exc).__name__})"]
    found: list[str] = []
    if not (partition / SUCCESS).is_file():
        found.append("_SUCCESS missing: the write did not finish")
    added = added or []
    expected = [n for n in columns if n not in added or ADDED_IN.get(n, 1) <= version]
    if not 1 <= version <= SCHEMA_VERSION or body.get("columns") != expected:
        found.append(f"manifest schema version {version} / columns differ from the contract")
    on_disk = {p.name for p in partition.glob("*.parquet")}
    for name in sorted(on_disk - files.keys()):
        found.append(f"{name} is not in the manifest")
    for name, entry in sorted(files.items()):
        path = partition / name
        if not path.is_file():
            found.append(f"{name} listed in the manifest is missing")
        elif sha256_of(path) != entry["sha256"]:
            found.append(f"{name} checksum differs from the manifest")
    return found


def mark_synthesized(partition: Path, *, by: str) -> None:
    """Say in ``partition`` that its rows were made up by ``by`` (not real traffic)."""
    (partition / SYNTHESIZED).write_text(json.dumps({"synthesized_by": by}) + "\n", "utf-8")


def synthesized_days(lake: Path | str) -> list[date]:
    """The days of a local lake whose every partition of ``DAY_TABLES`` carries the
    ``_SYNTHESIZED`` marker (a day the server's rows were merged into is real); [] for a
    remote lake (``s3a://…``), whose days are not looked at."""
    if "://" in str(lake):
        return []
    marked: dict[date, list[bool]] = {}
    for table in DAY_TABLES:
        root = Path(lake) / table
        if not root.is_dir():
            continue
        for folder in root.glob("event_date=*"):
            try:
                day = date.fromisoformat(folder.name.split("=", 1)[1])
            except ValueError:
                continue
            if folder.is_dir():
                marked.setdefault(day, []).append((folder / SYNTHESIZED).is_file())
    return sorted(day for day, flags in marked.items() if all(flags))

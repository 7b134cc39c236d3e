"""A partition's manifest: what the writer put in the partition, so a reader can tell a
complete, intact day from a missing, partial or altered one.

Each ``event_date=YYYY-MM-DD/`` directory written by ``analytics.lake.write_partition``
holds, besides its Parquet file, ``_manifest.json`` (table, day, schema version, columns,
and per file its rows, bytes and SHA-256) and an empty ``_SUCCESS`` written last. Names
starting with ``_`` are skipped by Spark and DuckDB as data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

# 1: the contract's columns (contract §5.1); 2: transactions gains offline, captured_at and
# duplicate_override (issues 16, 17). A partition of an older version is intact when its
# columns are the contract's without the ones added since (``analytics.lake.ADDED_COLUMNS``).
SCHEMA_VERSION = 2
MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"


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


def render(table: str, day: date, columns: list[str], files: list[FileEntry]) -> str:
    body: dict[str, Any] = {
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
    version 1, which a manifest of an older version rightly lacks."""
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
    older = [name for name in columns if name not in (added or [])]
    written = body.get("columns")
    known = written == columns if version == SCHEMA_VERSION else written == older
    if not 1 <= version <= SCHEMA_VERSION or not known:
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

"""A steady create load on the embedded SQLite, with the WAL file's size sampled beside it:
``python -m tests.api.storage_faults.steady --seconds 300`` (the figure docs/operations.md
gives for the WAL's bound). ``test_wal_bound`` runs a shorter one."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from idempay_tools._chaos_diskfull import Load
from tests.support.backend import Backend


def steady(tmp: Path, seconds: float, clients: int = 16) -> dict[str, object]:
    backend = Backend("sqlite", None, tmp)
    backend.migrate()
    api_key = backend.api_key("steady")
    server = backend.server()
    wal = Path(backend.url.split("///", 1)[1] + "-wal")
    load = Load(server.url, api_key, clients=clients, wal=wal).start()
    started = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        load.stop()
        took = time.monotonic() - started
        backend.stop_all()
    counts = load.counts()
    return {
        "seconds": round(took, 1),
        "answers": {str(k): v for k, v in counts.items()},
        "creates_per_s": round(counts.get(201, 0) / took, 1),
        "wal_max_bytes": load.wal_max,
        "database_bytes": Path(backend.url.split("///", 1)[1]).stat().st_size,
    }


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on the way out
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="idempay-steady-") as tmp:
        print(json.dumps(steady(Path(tmp), args.seconds, args.clients)))


if __name__ == "__main__":
    main()

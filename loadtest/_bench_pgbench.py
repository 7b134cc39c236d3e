"""The Postgres ceiling: pgbench running the statements one create runs on Postgres.

``TransactionService.create``: an autocommit SELECT of the key row (the create's read), then
phase 1, the claim (``service._claim``): ``SET LOCAL lock_timeout``; INSERT idempotency_key
(processing, lease token 1, the request) ON CONFLICT DO NOTHING; COMMIT — then the 0200 at
the acquirer, no transaction open — then phase 3, the finish (``service.finish``): UPDATE
idempotency_key to completed with the ~330-byte response WHERE its lease token is still
ours; INSERT "transaction" (with its RRN); INSERT ledger_entry; INSERT outbox_event; COMMIT.
The script does the same SQL, with a fresh random key per transaction (the first SELECT both
draws the key and probes the key row, as the create's read does), under one merchant id of
its own, as the bench's creates all come from one merchant. It leaves out what is not SQL on
that path — the acquirer's round trip between the two commits — and the request events the
server writes in batches off the request path. Keep it in step with ``service._claim`` and
``service.finish``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MERCHANT = "mer_pgbench"
FINGERPRINT = "f" * 64
# The create's ~330-byte response body; pgbench reads ":name" as a variable even inside a
# literal, so every colon is followed by a space and the timestamps use ISO 8601 basic form.
RESPONSE = (
    '{"id": "00000000-0000-4000-8000-000000000000", "status": "approved", "decline_reason": '
    'null, "authorization_code": "A1B2C3", "terminal_id": "T-0001", "type": "purchase", '
    '"amount": 1250, "currency": "BRL", "card": {"last4": "4242", "brand": "visa"}, '
    '"installments": 1, "created_at": "20261121T200000.000000Z", '
    '"processed_at": "20261121T200000.000000Z", "reversed_at": null}'
)
# The stored request (the body the claim keeps until the finish), colons spaced as above.
REQUEST = (
    '{"terminal_id": "T-0001", "type": "purchase", "amount": 1250, "currency": "BRL", '
    '"card": {"token": "tok_visa", "last4": "4242", "brand": "visa"}, "installments": 1, '
    '"captured_at": null, "expires_at": null, "metadata": {}}'
)
PAYLOAD = (
    '{"event_id": "00000000-0000-4000-8000-000000000001", "type": "transaction.completed", '
    '"merchant_id": "mer_pgbench", "seq": 1, "transaction_id": '
    '"00000000-0000-4000-8000-000000000000", "occurred_at": "20261121T200000.000000Z", '
    '"data": ' + RESPONSE + "}"
)
SCRIPT = f"""\
SELECT u.k AS k, upper(left(md5(u.k), 12)) AS rrn, upper(left(md5(u.k), 6)) AS ac, i.state AS st FROM (SELECT gen_random_uuid()::text AS k) AS u LEFT JOIN idempotency_key AS i ON i.merchant_id = '{MERCHANT}' AND i.key = u.k \\gset
BEGIN;
SET LOCAL lock_timeout = '250ms';
INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token, lease_until, request, response_status, response_body, terminal_id, created_at, updated_at, deadline_at) VALUES ('{MERCHANT}', :k, 'processing', '{FINGERPRINT}', 1, now() + interval '18 seconds', '{REQUEST}', NULL, NULL, 'T-0001', now(), now(), now() + interval '60 seconds') ON CONFLICT DO NOTHING;
COMMIT;
BEGIN;
UPDATE idempotency_key SET state = 'completed', response_status = 201, response_body = '{RESPONSE}', request = NULL, lease_until = NULL, updated_at = now() WHERE merchant_id = '{MERCHANT}' AND key = :k AND state = 'processing' AND lease_token = 1;
INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4, card_brand, card_fingerprint, installments, status, decline_reason, authorization_code, captured_at, created_at, processed_at, metadata, rrn) VALUES ('{MERCHANT}', :k, 'T-0001', 'purchase', 1250, 'BRL', '4242', 'visa', '{FINGERPRINT}', 1, 'approved', NULL, :ac, NULL, now(), now(), NULL, :rrn);
INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind, created_at) VALUES (gen_random_uuid()::text, '{MERCHANT}', :k, 1250, 'BRL', 'charge', now());
INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at) VALUES (gen_random_uuid()::text, '{MERCHANT}', 'transaction.completed', :k, '{PAYLOAD}', now());
COMMIT;
"""  # noqa: E501


@dataclass(slots=True)
class PgbenchResult:
    tps: float = 0.0
    latency_avg_ms: float = 0.0
    transactions: int = 0
    failed: int = 0
    ok: bool = True
    message: str = ""


def find() -> str | None:
    return shutil.which("pgbench")


def _without_outbox(script: str) -> str:
    lines = script.splitlines(keepends=True)
    return "".join(line for line in lines if "outbox" not in line)


VARIANTS = {  # scenario name → script
    "pgbench": SCRIPT,
    "pgbench-no-outbox": _without_outbox(SCRIPT),  # the same minus the two outbox statements
}


def write_script(directory: Path, variant: str = "pgbench") -> Path:
    path = directory / f"{variant}.sql"
    path.write_text(VARIANTS[variant])
    return path


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


def run(
    pgbench: str, script: Path, database: str, *, seconds: int, clients: int, threads: int
) -> PgbenchResult:
    """``pgbench -n -M prepared -f script -T seconds -c clients -j threads`` on ``database``."""
    command = [pgbench, "-n", "-M", "prepared", "-f", str(script), "-T", str(seconds)]
    command += ["-c", str(clients), "-j", str(threads), "-h", "127.0.0.1", "-U", "postgres"]
    done = subprocess.run(
        [*command, database], capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    text = done.stdout + done.stderr
    result = PgbenchResult(
        tps=_number(r"tps = ([\d.]+) \(without initial connection time\)", text),
        latency_avg_ms=_number(r"latency average = ([\d.]+) ms", text),
        transactions=int(_number(r"number of transactions actually processed: (\d+)", text)),
        failed=int(_number(r"number of failed transactions: (\d+)", text)),
    )
    if done.returncode != 0 or result.tps == 0.0:
        result.ok = False
        result.message = text.strip()[-1500:]
    return result

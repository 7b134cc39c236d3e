"""The acquirer's rules by RRN, each one operation of the store (run by the ``Committer``,
so each reads and writes with no race and is durable before its answer is written).

The test tokens (SPEC §2), decided on the first 0200 of an RRN:

==============================  ==============================================================
``tok_decline_insufficient_…``  declined ``51``
``tok_decline_do_not_honor``    declined ``05``
``tok_issuer_slow``             approved; answered after ``--slow-seconds`` (default 2 s)
``tok_issuer_timeout``          approved, and the first 0200 of the RRN is never answered (a
                                lost answer: the gateway must reverse what it cannot see); a
                                later 0200 with the same RRN gets the original 0210
``tok_issuer_down``             no decision (the issuer is unreachable): recorded, never
                                answered, nothing approved — ever, however often it is sent
any other ``tok_*``             approved, a 6-character authorization code
not a ``tok_`` token            declined ``14`` (invalid card)
==============================  ==============================================================

Duplicates, reversals and advices, by RRN:

- An offline sale comes as a 0220 advice (0221 when repeated) and is decided by the same
  rules, answered 0230; it is not a 0200 and never counts as one (``requests``).
- A repeated 0200 counts (``requests``) and gets the original 0210: the same response and
  authorization codes, echoing the repeat's own STAN.
- 0400 / 0420 / 0421 reverse an approval once (the first sets ``reversed_at``; later ones
  change nothing) and are always acknowledged ``00`` — for a declined or undecided RRN,
  and for an RRN never seen (recorded with ``requests = 0``).
- A 0200 arriving after a reversal or advice for its RRN is recorded and **declined**
  (``REVERSED_FIRST``): it can never end as an unreversed approval, and the acquirer never
  approves what the gateway has already written off.
"""

from __future__ import annotations

import random
import sqlite3
import string
from dataclasses import dataclass

from api.acquirer.host.store import now_iso, read_authorization

__all__ = [
    "APPROVED",
    "INVALID_CARD",
    "REVERSED_FIRST",
    "Decision",
    "Financial",
    "authorize",
    "note_dropped",
    "note_undecided",
    "record_message",
    "reverse",
    "stamp",
]

APPROVED = "00"
INVALID_CARD = "14"
REVERSED_FIRST = "12"  # invalid transaction: its reversal or advice came first
_DECLINES = {"tok_decline_insufficient_funds": "51", "tok_decline_do_not_honor": "05"}
_CODE_ALPHABET = string.ascii_uppercase + string.digits


@dataclass(frozen=True, slots=True)
class Financial:
    """A 0200, 0400, 0420 or 0421 as the rules see it (currency alphabetic)."""

    mti: str
    stan: str
    rrn: str
    processing_code: str
    amount: int
    currency: str
    merchant_id: str
    terminal_id: str
    card_token: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What to answer (``answer`` False: nothing, ever, for this message)."""

    message_id: int
    answer: bool
    response_code: str | None
    authorization_code: str | None
    slow: bool = False
    duplicate: bool = False


def record_message(
    conn: sqlite3.Connection,
    *,
    connection: int,
    mti: str,
    stan: str | None,
    rrn: str | None,
    fate: str,
) -> int:
    cur = conn.execute(
        "INSERT INTO message (connection, mti, stan, rrn, received_at, fate)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (connection, mti, stan, rrn, now_iso(), fate),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def stamp(
    conn: sqlite3.Connection,
    *,
    message_id: int,
    fate: str,
    response_mti: str | None = None,
    response_code: str | None = None,
    answered: bool = False,
) -> None:
    """What became of a message: answered (with what, when), dropped, withheld."""
    conn.execute(
        "UPDATE message SET fate = ?, response_mti = ?, response_code = ?, answered_at = ?"
        " WHERE id = ?",
        (fate, response_mti, response_code, now_iso() if answered else None, message_id),
    )


def _token_rule(token: str, rng: random.Random) -> tuple[str, str | None, str | None]:
    """(state, response code, authorization code) for a first decision."""
    if token == "tok_issuer_down":
        return "received", None, None
    if token in _DECLINES:
        return "declined", _DECLINES[token], None
    if not token.startswith("tok_"):
        return "declined", INVALID_CARD, None
    return "approved", APPROVED, "".join(rng.choice(_CODE_ALPHABET) for _ in range(6))


def _insert(conn: sqlite3.Connection, msg: Financial, *, requests: int, state: str) -> None:
    conn.execute(
        "INSERT INTO authorization (rrn, stan, merchant_id, terminal_id, processing_code,"
        " amount, currency, state, requests, first_received_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            msg.rrn,
            msg.stan,
            msg.merchant_id,
            msg.terminal_id,
            msg.processing_code,
            msg.amount,
            msg.currency,
            state,
            requests,
            now_iso(),
        ),
    )


def note_undecided(conn: sqlite3.Connection, msg: Financial, *, connection: int) -> None:
    """A 0200 received and dropped before any decision (a fault): it counts, nothing else."""
    record_message(
        conn,
        connection=connection,
        mti=msg.mti,
        stan=msg.stan,
        rrn=msg.rrn,
        fate="dropped_before_decision",
    )
    if read_authorization(conn, msg.rrn) is None:
        _insert(conn, msg, requests=1, state="received")
    else:
        conn.execute("UPDATE authorization SET requests = requests + 1 WHERE rrn = ?", (msg.rrn,))


def note_dropped(conn: sqlite3.Connection, msg: Financial, *, connection: int) -> None:
    """A message received and dropped before any decision (a fault): a 0200 counts
    (``requests``) with no decision; a reversal or advice changes nothing."""
    if msg.mti == "0200":
        note_undecided(conn, msg, connection=connection)
    else:
        record_message(
            conn,
            connection=connection,
            mti=msg.mti,
            stan=msg.stan,
            rrn=msg.rrn,
            fate="dropped_before_decision",
        )


def authorize(
    conn: sqlite3.Connection,
    msg: Financial,
    *,
    connection: int,
    rng: random.Random,
    drop: str | None = None,
) -> Decision:
    """Apply one 0200 (or an offline sale's 0220/0221 advice) by the rules above. ``drop``
    is the fate a fault already chose for its answer (``answer_dropped``,
    ``connection_dropped``), recorded with the decision."""
    message_id = record_message(
        conn, connection=connection, mti=msg.mti, stan=msg.stan, rrn=msg.rrn, fate="pending"
    )
    row = read_authorization(conn, msg.rrn)
    counted = msg.mti == "0200"  # ``requests`` counts 0200s; an offline sale's advice is not one
    if row is None:
        _insert(conn, msg, requests=int(counted), state="received")
    elif counted:
        conn.execute("UPDATE authorization SET requests = requests + 1 WHERE rrn = ?", (msg.rrn,))
    if row is not None and row.state != "received":
        decision = Decision(
            message_id, True, row.response_code, row.authorization_code, duplicate=True
        )
    else:
        decision = _decide(
            conn,
            msg,
            message_id=message_id,
            rng=rng,
            reversed_first=row is not None and row.reversed_at is not None,
            first_ever=row is None or row.requests == 0,
        )
    return _recorded(conn, decision, drop)


def _recorded(conn: sqlite3.Connection, decision: Decision, drop: str | None) -> Decision:
    """Mark the message duplicate, withheld or dropped in the decision's transaction."""
    fate = drop if decision.answer else "withheld"
    conn.execute(
        "UPDATE message SET duplicate = ?, fate = coalesce(?, fate) WHERE id = ?",
        (int(decision.duplicate), fate, decision.message_id),
    )
    return decision


def _decide(
    conn: sqlite3.Connection,
    msg: Financial,
    *,
    message_id: int,
    rng: random.Random,
    reversed_first: bool,
    first_ever: bool,
) -> Decision:
    rule = ("declined", REVERSED_FIRST, None) if reversed_first else None
    state, code, auth = rule or _token_rule(msg.card_token, rng)
    if state == "received":  # tok_issuer_down: no decision, no answer
        return Decision(message_id, False, None, None)
    now = now_iso()
    conn.execute(
        "UPDATE authorization SET stan = ?, merchant_id = ?, terminal_id = ?,"
        " processing_code = ?, amount = ?, currency = ?, state = ?, response_code = ?,"
        " authorization_code = ?, decided_at = ?, approved_at = ? WHERE rrn = ?",
        (
            msg.stan,
            msg.merchant_id,
            msg.terminal_id,
            msg.processing_code,
            msg.amount,
            msg.currency,
            state,
            code,
            auth,
            now,
            now if state == "approved" else None,
            msg.rrn,
        ),
    )
    withheld = state == "approved" and msg.card_token == "tok_issuer_timeout" and first_ever
    slow = state == "approved" and msg.card_token == "tok_issuer_slow"
    return Decision(message_id, not withheld, code, auth, slow=slow)


def reverse(
    conn: sqlite3.Connection, msg: Financial, *, connection: int, drop: str | None = None
) -> Decision:
    """Apply one 0400 / 0420 / 0421: reverse once, acknowledge always."""
    message_id = record_message(
        conn, connection=connection, mti=msg.mti, stan=msg.stan, rrn=msg.rrn, fate="pending"
    )
    row = read_authorization(conn, msg.rrn)
    if row is None:
        _insert(conn, msg, requests=0, state="received")
    if row is None or row.reversed_at is None:
        conn.execute(
            "UPDATE authorization SET reversed_at = ?, reversal_mti = ? WHERE rrn = ?",
            (now_iso(), msg.mti, msg.rrn),
        )
    repeated = row is not None and row.reversed_at is not None
    return _recorded(conn, Decision(message_id, True, APPROVED, None, duplicate=repeated), drop)

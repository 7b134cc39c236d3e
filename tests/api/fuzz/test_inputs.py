"""Hypothesis-generated headers and bodies against every endpoint (contract §2): never a 5xx,
every 4xx a problem+json with a documented code, 2xx bodies that conform to the OpenAPI
schema, Idempotency-Status on every create/lookup/abort answer, and the status the spec
gives for each class of input. Afterwards no transaction is half-written, and no card
number sent in a body was stored or logged."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.sale_rules import CURRENCIES
from tests.api.fuzz.conftest import Target
from tests.api.fuzz.contract import assert_whole, check_response
from tests.support.client import CARD
from tests.support.eventually import eventually

# IDEMPAY_FUZZ_EXAMPLES=2000 for a deeper local run; CI runs the derandomized default.
FUZZ = settings(
    max_examples=int(os.environ.get("IDEMPAY_FUZZ_EXAMPLES", "120")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# The module's last test checks what the fuzz tests before it left behind: under pytest-xdist
# the whole module runs on one worker, in file order.
pytestmark = pytest.mark.xdist_group("fuzz_inputs")
HEX = "0123456789abcdef"
SLOW_TOKENS = {"tok_issuer_slow", "tok_issuer_timeout", "tok_issuer_down"}


@dataclass
class Session:
    target: Target
    client: httpx.Client
    pans: list[str]


@pytest.fixture(scope="module")
def session(pg_target: Target) -> Iterator[Session]:
    with httpx.Client(base_url=pg_target.server.url, timeout=30.0) as client:
        yield Session(pg_target, client, [])


# --- headers -------------------------------------------------------------------------


@st.composite
def idempotency_keys(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(header value, is it valid per contract §2): a fresh UUID (any version, any case, bare or
    RFC 8941-quoted, with optional whitespace) or something that is not one."""
    key = str(uuid.uuid4())
    if draw(st.booleans()):
        key = "".join(c.upper() if draw(st.booleans()) else c for c in key)
        if draw(st.booleans()):
            key = f'"{key}"'
        return key.encode(), True
    broken = draw(
        st.sampled_from(
            [
                "{" + key + "}",
                "urn:uuid:" + key,
                key.replace("-", ""),
                key[:-1],
                key + "0",
                key[:8] + "_" + key[9:],
                key.replace("a", "g", 1) if "a" in key else "z" + key[1:],
                "'" + key + "'",
                '"' + key,
                '""' + key + '""',
                '" ' + key + ' "',
                key + ", " + key,
                key.replace("-", "\u2010"),  # unicode hyphen
                "".join(chr(0xFF10 + HEX.index(c)) if c in "0123456789" else c for c in key),
                "x" * 5000,
                "",
                "null",
            ]
        )
    )
    extra = draw(st.text(min_size=0, max_size=3, alphabet=WIRE_CHARS)).strip(" \t")
    value = broken + extra if draw(st.booleans()) else broken
    return value.encode("utf-8"), False


# What a client can put in a header value on the wire: no controls but HTAB, no DEL (h11
# refuses to send the rest; the raw-socket test sends those).
WIRE_CHARS = st.characters(codec="utf-8", min_codepoint=0x20, exclude_characters="\x7f")
_WIRE_BYTES = frozenset(range(0x20, 0x7F)) | frozenset(range(0x80, 0x100)) | {0x09}


def header_value() -> st.SearchStrategy[bytes]:
    """Any header value a client could send: printable, unicode (UTF-8), raw high bytes."""
    text = st.text(alphabet=WIRE_CHARS | st.just("\t"), max_size=300).map(
        lambda s: s.strip(" \t").encode("utf-8")
    )
    return st.one_of(
        text,
        st.binary(max_size=64).map(lambda b: bytes(c for c in b if c in _WIRE_BYTES).strip(b" \t")),
        st.sampled_from([b"1", b"0", b"-1", b"99999999999999999999", b"1e3", b"gprs", b"WiFi"]),
    )


@st.composite
def authorizations(draw: st.DrawFn, api_key: str) -> tuple[bytes | None, bool]:
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return f"Bearer {api_key}".encode(), True
    if choice == 1:
        return f"Bearer  {api_key}".encode(), True
    if choice == 2:
        return None, False
    if choice == 3:
        return b"Bearer " + api_key.encode()[:-1] + draw(
            st.sampled_from([b"x", b"\xff", b""])
        ), False
    if choice == 4:
        return draw(st.sampled_from([b"Basic " + api_key.encode(), b"Bearer", b"Token x"])), False
    return draw(header_value()), False


CONTENT_TYPES = st.one_of(
    st.none(),
    st.sampled_from(
        [
            b"application/json",
            b"application/json; charset=utf-8",
            b"text/plain",
            b"application/x-www-form-urlencoded",
            b"multipart/form-data; boundary=x",
            b"application/problem+json",
            b"",
        ]
    ),
    header_value(),
)


# --- bodies --------------------------------------------------------------------------


def _luhn_pan(digits: str) -> str:
    total = 0
    for index, char in enumerate(reversed(digits + "0")):
        value = int(char) * (2 if index % 2 else 1)
        total += value - 9 if value > 9 else value
    return digits + str((10 - total % 10) % 10)


PANS = (
    st.integers(11, 18)
    .flatmap(
        lambda n: st.text(alphabet="0123456789", min_size=n, max_size=n).map(lambda d: "4" + d[1:])
    )
    .map(_luhn_pan)
)
SAFE_TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC _-", max_size=40)


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    token = draw(st.from_regex(r"tok_[A-Za-z0-9_]{1,40}", fullmatch=True))
    if token in SLOW_TOKENS:
        token = "tok_visa"
    body: dict[str, Any] = {
        "terminal_id": draw(st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True)),
        # up to the contract's 10^12 (the gateway declines 10^12 itself: test_amount_bound)
        "amount": draw(st.integers(1, 10**12)),
        # ISO 4217, one with a numeric code: the acquirer's field 49 (contract §2.9)
        "currency": draw(st.sampled_from(CURRENCIES)),
        "card": {
            "token": token,
            "last4": draw(st.from_regex(r"[0-9]{4}", fullmatch=True)),
            "brand": draw(st.from_regex(r"[a-z][a-z0-9_]{0,31}", fullmatch=True)),
        },
    }
    if draw(st.booleans()):
        body["type"] = draw(st.sampled_from(["purchase", "refund"]))
    if draw(st.booleans()):
        body["installments"] = draw(st.integers(1, 24))
    if draw(st.booleans()):
        body["metadata"] = draw(st.dictionaries(SAFE_TEXT, SAFE_TEXT, max_size=5))
    if draw(st.booleans()):
        body["amount"] = float(body["amount"]) if body["amount"] < 2**53 else body["amount"]
    return body


BAD_FIELDS: dict[str, list[Any]] = {
    "terminal_id": ["", "x" * 65, "T 1", "T/1", 1, None, ["T"], "Tä"],
    "type": ["sale", "", None, 1, "PURCHASE"],
    "amount": [0, -1, 10**12 + 1, 12.5, "1250", True, None, [], {}, 1e300, -0.0],
    "currency": ["brl", "BR", "BRLL", "", 986, None, "B1L", "AAA", "XXX"],
    "card": [None, "tok_visa", [], {}, {"token": "tok_visa"}, {**CARD, "cvv": "123"}],
    "installments": [0, 25, 1.5, "2", None, True],
    # Numbers too: a timestamp is an RFC 3339 string, never read as Unix seconds.
    "captured_at": [
        "yesterday",
        "2026-11-20T12:00:00",
        "2026-13-40T00:00:00Z",
        True,
        {},
        0,
        1_795_000_000,
        1.5e9,
        # RFC 3339, but no instant in UTC (before year 1, after 9999): review finding B
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
    ],
    "expires_at": [
        "soon",
        "2026-11-20 12:00",
        "",
        [],
        0,
        4_102_444_800,
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
    ],
    "metadata": ["x", [], 1, {"k": "v" * 5000}],
}


@st.composite
def invalid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body with exactly one thing wrong with it: 422 validation_error."""
    body = draw(valid_bodies())
    field = draw(st.sampled_from([*BAD_FIELDS, "missing", "unknown", "card_field"]))
    if field == "missing":
        del body[draw(st.sampled_from(["terminal_id", "amount", "currency", "card"]))]
    elif field == "unknown":
        body[draw(st.sampled_from(["pan", "Amount", "extra", "id", "status"]))] = "x"
    elif field == "card_field":
        sub = draw(st.sampled_from(["token", "last4", "brand"]))
        body["card"][sub] = draw(
            st.sampled_from(["", "4242 ", "TOK", None, 4242, "tok_" + "a" * 125])
        )
    else:
        body[field] = draw(st.sampled_from(BAD_FIELDS[field]))
    return body


@st.composite
def bodies_with_pan(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    body = draw(valid_bodies())
    pan = draw(PANS)
    shown = draw(st.sampled_from([pan, " ".join(pan[i : i + 4] for i in range(0, len(pan), 4))]))
    where = draw(
        st.sampled_from(["metadata_value", "metadata_key", "terminal_id", "extra", "nested"])
    )
    if where == "metadata_value":
        body["metadata"] = {"note": f"card {shown} thanks"}
    elif where == "metadata_key":
        body["metadata"] = {shown: "x"}
    elif where == "terminal_id":
        body["terminal_id"] = pan
    elif where == "extra":
        body["pan"] = int(pan) if draw(st.booleans()) else shown
    else:
        body["metadata"] = {"a": [{"b": [shown]}]}
    return body, pan


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
RAW_JUNK = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"",
            b"{",
            b'{"amount": NaN}',
            b'{"amount": Infinity}',
            b"\xef\xbb\xbf{}",
            b'{"a":1,"a":2}',
            b"[" * 100_000,  # deep nesting, and over 16 KiB
            b"[" * 5000 + b"]" * 5000,
            b'{"amount": 1e400}',
            b'{"amount": 123456789012345678901234567890}',
            b'"\xff\xfe"',
            json.dumps({"amount": 1}).encode("utf-16"),
        ]
    ),
)


# --- the tests -----------------------------------------------------------------------


def _send(
    session: Session,
    method: str,
    path: str,
    headers: dict[str, bytes | None],
    content: bytes | None,
) -> httpx.Response:
    sent = {name: value for name, value in headers.items() if value is not None}
    return session.client.request(method, path, headers=sent, content=content)


def _auth(session: Session) -> bytes:
    return f"Bearer {session.target.api.api_key}".encode()


@FUZZ
@given(data=st.data())
def test_headers_on_create(session: Session, data: st.DataObject) -> None:
    key, key_ok = data.draw(idempotency_keys(), "Idempotency-Key")
    auth, auth_ok = data.draw(authorizations(session.target.api.api_key), "Authorization")
    headers = {
        "Idempotency-Key": key,
        "Authorization": auth,
        "Idempotency-Attempt": data.draw(st.none() | header_value(), "Idempotency-Attempt"),
        "POS-Network": data.draw(st.none() | header_value(), "POS-Network"),
        "Content-Type": data.draw(CONTENT_TYPES, "Content-Type"),
        "X-Request-Id": data.draw(st.none() | header_value(), "X-Request-Id"),
    }
    body = data.draw(valid_bodies(), "body")
    response = _send(session, "POST", "/v1/transactions", headers, json.dumps(body).encode())
    check_response(response, session.target.schemas)
    if not auth_ok:
        assert response.status_code == 401, response.text
    elif not key_ok:
        assert response.status_code == 400, response.text
        assert response.json()["code"] in ("idempotency_key_missing", "idempotency_key_invalid")
    else:
        # Telemetry and Content-Type never fail a payment.
        assert response.status_code == 201, response.text
        created = response.json()
        assert created["id"] == key.decode().strip(' \t"').lower()
        assert (created["amount"], created["currency"]) == (int(body["amount"]), body["currency"])
        assert response.headers["idempotency-status"] == "created"


@FUZZ
@given(data=st.data())
def test_bodies_on_create(session: Session, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["valid", "invalid", "pan", "json", "raw", "big"]), "kind")
    expected: tuple[int, set[str]]
    if kind == "valid":
        content = json.dumps(data.draw(valid_bodies(), "body")).encode()
        expected = (201, set())
    elif kind == "invalid":
        content = json.dumps(data.draw(invalid_bodies(), "body")).encode()
        expected = (422, {"validation_error"})
    elif kind == "pan":
        body, pan = data.draw(bodies_with_pan(), "body")
        session.pans.append(pan)
        content = json.dumps(body).encode()
        expected = (422, {"pan_not_allowed"})
    elif kind == "json":
        content = json.dumps(data.draw(JSON, "json")).encode()
        expected = (422, {"validation_error", "pan_not_allowed"})
    elif kind == "raw":
        content = data.draw(RAW_JUNK, "raw")
        expected = (
            (413, {"payload_too_large"})
            if len(content) > 16 * 1024
            else (422, {"validation_error", "pan_not_allowed"})
        )
    else:
        body = data.draw(valid_bodies(), "body")
        body["metadata"] = {"pad": "p" * data.draw(st.integers(16 * 1024, 40 * 1024), "size")}
        content = json.dumps(body).encode()
        expected = (413, {"payload_too_large"})
    headers = {"Authorization": _auth(session), "Idempotency-Key": str(uuid.uuid4()).encode()}
    response = _send(session, "POST", "/v1/transactions", headers, content)
    check_response(response, session.target.schemas)
    assert response.status_code == expected[0], (kind, content[:300], response.text)
    if expected[1]:
        assert response.json()["code"] in expected[1], response.text
        assert response.headers["idempotency-status"] == "not_found"


@FUZZ
@given(data=st.data())
def test_ids_headers_and_bodies_on_lookup_abort_reversal(
    session: Session, data: st.DataObject
) -> None:
    action = data.draw(st.sampled_from(["lookup", "abort", "reversal"]), "action")
    raw_id = data.draw(
        st.one_of(
            # A fresh key per example (derandomized draws repeat, and state persists).
            st.builds(lambda: str(uuid.uuid4())),
            st.builds(lambda: str(uuid.uuid4()).upper()),
            st.text(min_size=1, max_size=60),
            st.sampled_from(["%00", "..", "%2e%2e", "%2F", "' OR 1=1 --", "x" * 4000]),
        ),
        "id",
    )
    path = "/v1/transactions/" + quote(raw_id, safe="")
    if action != "lookup":
        path += f"/{action}"
    auth, auth_ok = data.draw(authorizations(session.target.api.api_key), "Authorization")
    headers = {
        "Authorization": auth,
        "Idempotency-Key": data.draw(st.none() | header_value(), "Idempotency-Key"),
        "Content-Type": data.draw(CONTENT_TYPES, "Content-Type"),
    }
    content = data.draw(st.none() | RAW_JUNK, "body")
    method = "GET" if action == "lookup" else "POST"
    response = _send(session, method, path, headers, content)
    check_response(response, session.target.schemas)
    if (
        response.status_code in (404, 405)
        and response.json()["code"] in ("not_found", "method_not_allowed")
        and "idempotency-status" not in response.headers
    ):
        return  # the id did not route to the endpoint (e.g. it decoded to a slash)
    is_uuid = _is_canonical_uuid(raw_id)
    if not auth_ok:
        assert response.status_code == 401, response.text
    elif not is_uuid:
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "idempotency_key_invalid"
    else:  # an unknown key
        assert response.status_code == {"lookup": 404, "abort": 200, "reversal": 404}[action]


def _is_canonical_uuid(value: str) -> bool:
    if len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


@FUZZ
@given(data=st.data())
def test_operations_endpoints_ignore_what_they_do_not_need(
    session: Session, data: st.DataObject
) -> None:
    path = data.draw(
        st.sampled_from(["/healthz", "/readyz", "/metrics", "/v1/idempotency-policy"]), "path"
    )
    method = data.draw(
        st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "DELETE", "PATCH"]), "method"
    )
    headers = {
        "Authorization": data.draw(st.none() | header_value(), "Authorization"),
        "Content-Type": data.draw(CONTENT_TYPES, "Content-Type"),
        "Idempotency-Key": data.draw(st.none() | header_value(), "Idempotency-Key"),
    }
    query = data.draw(
        st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3), "query"
    )
    content = data.draw(st.none() | RAW_JUNK, "body")
    sent = {name: value for name, value in headers.items() if value is not None}
    response = session.client.request(method, path, headers=sent, params=query, content=content)
    check_response(response, session.target.schemas)
    if method == "GET":
        assert response.status_code == 200, response.text
    else:
        assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
        assert "GET" in response.headers["allow"]


@pytest.mark.parametrize("attempt", [b"\xb9", b"\xb2\xb3", b"1\xb9", "\u0661".encode()])
def test_a_non_ascii_digit_attempt_is_unknown_not_a_500(session: Session, attempt: bytes) -> None:
    """Regression: ``"¹".isdigit()`` is true and ``int("¹")`` raises, so Idempotency-Attempt:
    0xB9 (latin-1 "¹") answered 500 before the fix. Telemetry never fails a payment."""
    key = str(uuid.uuid4())
    headers = {"Authorization": _auth(session), "Idempotency-Key": key.encode()}
    response = _send(
        session,
        "POST",
        "/v1/transactions",
        {**headers, "Idempotency-Attempt": attempt},
        json.dumps({"terminal_id": "T-1", "amount": 100, "currency": "BRL", "card": CARD}).encode(),
    )
    check_response(response, session.target.schemas)
    assert response.status_code == 201, response.text
    rows = eventually(
        lambda: session.target.backend.sql(
            "SELECT attempt FROM request_event WHERE idempotency_key = :k", k=key
        ),
        what="the create's request event",
    )
    assert [row[0] for row in rows] == [None]


def test_after_the_fuzz_nothing_is_half_written_and_no_pan_was_kept(session: Session) -> None:
    """Runs after the fuzz tests above (file order): the database is whole, and no PAN sent
    in a refused body is anywhere in the database or the server's log."""
    target = session.target
    report = assert_whole(target.backend, [target.merchant])
    assert report.transactions > 0
    assert session.pans, "the body fuzz sent no PAN"
    log = target.log_text()
    stored = target.backend.sql(
        "SELECT coalesce(request, '') || coalesce(response_body, '') FROM idempotency_key"
        " WHERE merchant_id = :m",
        m=target.merchant,
    )
    blob = log + "".join(row[0] for row in stored)
    for pan in session.pans:
        assert pan not in blob
        assert " ".join(pan[i : i + 4] for i in range(0, len(pan), 4)) not in blob
    assert "Traceback" not in log and "internal_error" not in log

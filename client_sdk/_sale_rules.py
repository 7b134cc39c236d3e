"""The create body's rules (contract §2.2): the one table both the server's schema and the
terminal SDK's offline check are built from.

Pure data and the card-number rule, standard library only: the server may not import the SDK
nor the SDK the server (``[tool.importlinter]``), so ``api/sale_rules.py`` is a
generated copy of the part of this file between the markers — regenerate it after any change
with ``python -m client_sdk._sale_rules > api/sale_rules.py`` (a test fails
while the copy differs). ``api/transactions/schemas.py`` takes every bound, pattern and
choice from that copy; ``client_sdk/_validate.py`` reads this table. A test runs both on
generated bodies and requires the same verdict.

The table is JSON-schema-like: ``properties`` of an object with ``type`` (``string``:
a JSON string and nothing else; ``integer``: a whole number — ``1250.0`` is ``1250``, a
boolean is not one — within ``minimum``/``maximum``; ``boolean``; ``object``),
``pattern`` (a whole-string match), ``enum``, ``required``, ``additional_properties``;
``timestamp`` is an RFC 3339 date-time with an offset whose UTC instant is in years 1–9999;
``max_bytes`` / ``max_depth`` bound an object's compact UTF-8 JSON size and nesting.
"""

from __future__ import annotations

import re
from typing import Any, Final

# --- generated copy: begin ---
BODY_MAX_BYTES: Final = 16 * 1024
"""The largest create body accepted (413 ``payload_too_large`` above)."""
METADATA_MAX_BYTES: Final = 4096
"""``metadata`` serialized compactly (UTF-8, non-ASCII unescaped) may not exceed this."""
METADATA_MAX_DEPTH: Final = 16
"""Nesting levels under ``metadata`` (an object directly in it is 2)."""

CARD: Final[dict[str, Any]] = {
    "type": "object",
    "additional_properties": False,
    "required": ["token", "last4", "brand"],
    "properties": {
        "token": {"type": "string", "pattern": r"^tok_[A-Za-z0-9_]{1,124}$"},
        "last4": {"type": "string", "pattern": r"^[0-9]{4}$"},
        "brand": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,31}$"},
    },
}

# The ISO 4217 currencies the acquirer link can carry (field 49, numeric): any other
# three letters would be refused at the acquirer, so they are refused here.
CURRENCIES: Final[tuple[str, ...]] = (
    "AED",
    "AFN",
    "ALL",
    "AMD",
    "AOA",
    "ARS",
    "AUD",
    "AWG",
    "AZN",
    "BAM",
    "BBD",
    "BDT",
    "BGN",
    "BHD",
    "BIF",
    "BMD",
    "BND",
    "BOB",
    "BOV",
    "BRL",
    "BSD",
    "BTN",
    "BWP",
    "BYN",
    "BZD",
    "CAD",
    "CDF",
    "CHE",
    "CHF",
    "CHW",
    "CLF",
    "CLP",
    "CNY",
    "COP",
    "COU",
    "CRC",
    "CUC",
    "CUP",
    "CVE",
    "CZK",
    "DJF",
    "DKK",
    "DOP",
    "DZD",
    "EGP",
    "ERN",
    "ETB",
    "EUR",
    "FJD",
    "FKP",
    "GBP",
    "GEL",
    "GHS",
    "GIP",
    "GMD",
    "GNF",
    "GTQ",
    "GYD",
    "HKD",
    "HNL",
    "HTG",
    "HUF",
    "IDR",
    "ILS",
    "INR",
    "IQD",
    "IRR",
    "ISK",
    "JMD",
    "JOD",
    "JPY",
    "KES",
    "KGS",
    "KHR",
    "KMF",
    "KPW",
    "KRW",
    "KWD",
    "KYD",
    "KZT",
    "LAK",
    "LBP",
    "LKR",
    "LRD",
    "LSL",
    "LYD",
    "MAD",
    "MDL",
    "MGA",
    "MKD",
    "MMK",
    "MNT",
    "MOP",
    "MRU",
    "MUR",
    "MVR",
    "MWK",
    "MXN",
    "MXV",
    "MYR",
    "MZN",
    "NAD",
    "NGN",
    "NIO",
    "NOK",
    "NPR",
    "NZD",
    "OMR",
    "PAB",
    "PEN",
    "PGK",
    "PHP",
    "PKR",
    "PLN",
    "PYG",
    "QAR",
    "RON",
    "RSD",
    "RUB",
    "RWF",
    "SAR",
    "SBD",
    "SCR",
    "SDG",
    "SEK",
    "SGD",
    "SHP",
    "SLE",
    "SLL",
    "SOS",
    "SRD",
    "SSP",
    "STN",
    "SVC",
    "SYP",
    "SZL",
    "THB",
    "TJS",
    "TMT",
    "TND",
    "TOP",
    "TRY",
    "TTD",
    "TWD",
    "TZS",
    "UAH",
    "UGX",
    "USD",
    "USN",
    "UYI",
    "UYU",
    "UYW",
    "UZS",
    "VED",
    "VES",
    "VND",
    "VUV",
    "WST",
    "XAF",
    "XCD",
    "XCG",
    "XOF",
    "XPF",
    "YER",
    "ZAR",
    "ZMW",
    "ZWG",
    "ZWL",
)

CREATE_BODY: Final[dict[str, Any]] = {
    "type": "object",
    "additional_properties": False,
    "required": ["terminal_id", "amount", "currency", "card"],
    "properties": {
        "terminal_id": {"type": "string", "pattern": r"^[A-Za-z0-9_.\-]{1,64}$"},
        "type": {"enum": ["purchase", "refund"], "default": "purchase"},
        "amount": {"type": "integer", "minimum": 1, "maximum": 10**12},
        "currency": {"type": "string", "pattern": "^(?:" + "|".join(CURRENCIES) + ")$"},
        "card": CARD,
        "installments": {"type": "integer", "minimum": 1, "maximum": 24, "default": 1},
        "captured_at": {"type": "timestamp", "nullable": True},
        "expires_at": {"type": "timestamp", "nullable": True},
        "metadata": {
            "type": "object",
            "max_bytes": METADATA_MAX_BYTES,
            "max_depth": METADATA_MAX_DEPTH,
        },
        "entry_mode": {"enum": ["online", "offline"], "default": "online"},
        "allow_duplicate": {"type": "boolean", "default": False},
    },
    # an offline advice carries its original captured_at
    "requires": [{"when": {"entry_mode": "offline"}, "then_present": "captured_at"}],
}
# --- the card-number rule (contract §2: a PAN anywhere in the body is 422 pan_not_allowed) --
# 12–19 digits, optionally grouped by single spaces or dashes, not part of a longer digit
# run. Digits are Unicode decimal digits (``\d``: ASCII, Arabic-Indic, fullwidth, …) — a card
# number spelled in any script is a card number; ``²`` and other non-decimal digits are not.
PAN_CANDIDATE: Final = re.compile(r"(?<!\d)(?<!\d[ -])\d(?:[ -]?\d){11,18}(?![ -]?\d)")
# A canonical UUID is an identifier (order ids, the idempotency key itself), never a card
# number, but its hex groups hold digit runs that pass Luhn about 0.35 % of the time: blank
# UUIDs out before looking (a UUID can hide at most 12 consecutive digits).
UUID_TEXT: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE
)
_PAN_SEPARATORS: Final = re.compile(r"[ -]")


def luhn_ok(digits: str) -> bool:
    """The Luhn check over decimal digits of any script (``int`` reads each)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def pan_digits(run: str) -> str:
    """A candidate run without its separators."""
    return _PAN_SEPARATORS.sub("", run)


def without_uuids(text: str) -> str:
    return UUID_TEXT.sub(lambda m: "u" * len(m.group()), text) if "-" in text else text


def string_has_pan(text: str) -> bool:
    for match in PAN_CANDIDATE.finditer(without_uuids(text)):
        digits = pan_digits(match.group())
        if 12 <= len(digits) <= 19 and luhn_ok(digits):
            return True
    return False


def contains_pan(value: Any) -> bool:
    """True when any string, number or object key in ``value`` (a decoded JSON body) looks
    like a card number — integers and floats as their decimal text."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if string_has_pan(item):
                return True
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if string_has_pan(str(abs(item))):
                return True
        elif isinstance(item, float):
            if string_has_pan(repr(item)):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


# --- generated copy: end ---

GENERATED_HEADER = (
    '"""The create body\'s rules — GENERATED from ``client_sdk/_sale_rules.py``; do not edit.\n'
    "\n"
    "Regenerate: ``python -m client_sdk._sale_rules > api/sale_rules.py``. The\n"
    "server may not import the terminal SDK (``[tool.importlinter]``), so it reads this copy;\n"
    "a test fails while it differs from the SDK's table.\n"
    '"""\n'
    "\n"
    "from __future__ import annotations\n"
    "\n"
    "import re\n"
    "from typing import Any, Final\n"
    "\n"
)


def generated_copy(source: str) -> str:
    """The server's copy of this module's table, from this module's ``source`` text."""
    begin, end = "# --- generated copy: begin ---\n", "# --- generated copy: end ---\n"
    table = source.split(begin, 1)[1].split(end, 1)[0]
    return GENERATED_HEADER + table.rstrip("\n") + "\n"


if __name__ == "__main__":  # python -m client_sdk._sale_rules > api/sale_rules.py
    import sys

    with open(__file__, encoding="utf-8") as own:
        sys.stdout.write(generated_copy(own.read()))

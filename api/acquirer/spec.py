"""The ISO 8583 message specification idempay and the acquirer host speak (a pyiso8583 spec).

ISO 8583:1987 field layout, every element ASCII, no message header; each message travels
behind a 2-byte big-endian length (:mod:`api.acquirer.framing`). Only the fields below
exist: a bitmap naming any other field is a decode error (garbage).

======  ======================  ===========  ==================================================
field   name                    format       content
======  ======================  ===========  ==================================================
t       message type (MTI)      n4           0200/0210 financial, 0400/0410 reversal,
                                             0420/0421/0430 reversal advice, 0800/0810 network
p       primary bitmap          an16         hex, written by pyiso8583
1       secondary bitmap        an16         hex, present when a field 65–128 is (70, 90)
3       processing code         n6           ``000000`` purchase, ``200000`` refund
4       amount, transaction     n12          minor units, zero-padded (``000000001250``)
7       transmission date-time  n10          ``MMDDhhmmss``, UTC, when the message was sent
11      STAN                    n6           ``000001``–``999999``, per link, wraps; echoed
12      local time              n6           ``hhmmss`` of ``captured_at`` (terminal's clock)
13      local date              n4           ``MMDD`` of ``captured_at``
37      RRN                     an12         ``[0-9A-Z]{12}``, derived from (merchant, key)
                                             with an HMAC; stable across restarts; echoed
38      authorization code      an6          in an approved 0210
39      response code           an2          ``00`` approved; :data:`RESPONSE_CODES`
41      terminal id             ans8         derived from idempay's terminal id (hash)
42      merchant id             ans15        derived from idempay's merchant id (hash)
48      private data            LLLVAR       ``M=<merchant>;T=<terminal>;K=<token>``:
                                ans..999     idempay's own ids and the card token, each
                                             value percent-encoded (:mod:`messages`)
49      currency code           n3           ISO 4217 numeric (:data:`CURRENCY_NUMERIC`)
70      network mgmt code       n3           ``001`` sign-on, ``002`` sign-off, ``301`` echo
90      original data elements  n42          original MTI (4) + STAN (6) + transmission
                                             date-time (10) + acquirer id (11) + forwarding
                                             id (11)
======  ======================  ===========  ==================================================

Which message carries which field:

- 0200: 3 4 7 11 [12 13] 37 41 42 48 49 (12/13 only when ``captured_at`` is known)
- 0210: the request's 3 4 7 11 37 41 42 49, plus 39 and (approved) 38
- 0400 / 0420 / 0421: 3 4 7 11 37 41 42 48 49 90 — own STAN in 11, the original's in 90
- 0410 / 0430: the request's 3 4 7 11 37 41 42 49 90, plus 39
- 0800: 7 11 70 — 0810: 7 11 39 70
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CURRENCY_ALPHA",
    "CURRENCY_NUMERIC",
    "SPEC",
    "UnsupportedCurrency",
    "currency_alpha",
    "currency_numeric",
]


def _fixed(length: int, desc: str) -> dict[str, Any]:
    return {"data_enc": "ascii", "len_enc": "ascii", "len_type": 0, "max_len": length, "desc": desc}


SPEC: dict[str, dict[str, Any]] = {
    "h": _fixed(0, "Message Header (none)"),
    "t": _fixed(4, "Message Type Indicator"),
    "p": _fixed(16, "Bitmap, Primary"),
    "1": _fixed(16, "Bitmap, Secondary"),
    "3": _fixed(6, "Processing Code"),
    "4": _fixed(12, "Amount, Transaction"),
    "7": _fixed(10, "Transmission Date and Time"),
    "11": _fixed(6, "System Trace Audit Number"),
    "12": _fixed(6, "Time, Local Transaction"),
    "13": _fixed(4, "Date, Local Transaction"),
    "37": _fixed(12, "Retrieval Reference Number"),
    "38": _fixed(6, "Authorization Identification Response"),
    "39": _fixed(2, "Response Code"),
    "41": _fixed(8, "Card Acceptor Terminal Identification"),
    "42": _fixed(15, "Card Acceptor Identification Code"),
    "48": {
        "data_enc": "ascii",
        "len_enc": "ascii",
        "len_type": 3,
        "max_len": 999,
        "desc": "Additional Data - Private",
    },
    "49": _fixed(3, "Currency Code, Transaction"),
    "70": _fixed(3, "Network Management Information Code"),
    "90": _fixed(42, "Original Data Elements"),
}


class UnsupportedCurrency(ValueError):
    """The currency has no ISO 4217 numeric code in :data:`CURRENCY_NUMERIC`."""


# ISO 4217 currencies in circulation (funds codes included; precious metals, test and
# "no currency" codes excluded). The server accepts any three upper-case letters; a code
# missing here cannot be authorized (UnsupportedCurrency).
CURRENCY_NUMERIC: dict[str, str] = {
    "AED": "784", "AFN": "971", "ALL": "008", "AMD": "051", "AOA": "973", "ARS": "032",
    "AUD": "036", "AWG": "533", "AZN": "944", "BAM": "977", "BBD": "052", "BDT": "050",
    "BGN": "975", "BHD": "048", "BIF": "108", "BMD": "060", "BND": "096", "BOB": "068",
    "BOV": "984", "BRL": "986", "BSD": "044", "BTN": "064", "BWP": "072", "BYN": "933",
    "BZD": "084", "CAD": "124", "CDF": "976", "CHE": "947", "CHF": "756", "CHW": "948",
    "CLF": "990", "CLP": "152", "CNY": "156", "COP": "170", "COU": "970", "CRC": "188",
    "CUC": "931", "CUP": "192", "CVE": "132", "CZK": "203", "DJF": "262", "DKK": "208",
    "DOP": "214", "DZD": "012", "EGP": "818", "ERN": "232", "ETB": "230", "EUR": "978",
    "FJD": "242", "FKP": "238", "GBP": "826", "GEL": "981", "GHS": "936", "GIP": "292",
    "GMD": "270", "GNF": "324", "GTQ": "320", "GYD": "328", "HKD": "344", "HNL": "340",
    "HTG": "332", "HUF": "348", "IDR": "360", "ILS": "376", "INR": "356", "IQD": "368",
    "IRR": "364", "ISK": "352", "JMD": "388", "JOD": "400", "JPY": "392", "KES": "404",
    "KGS": "417", "KHR": "116", "KMF": "174", "KPW": "408", "KRW": "410", "KWD": "414",
    "KYD": "136", "KZT": "398", "LAK": "418", "LBP": "422", "LKR": "144", "LRD": "430",
    "LSL": "426", "LYD": "434", "MAD": "504", "MDL": "498", "MGA": "969", "MKD": "807",
    "MMK": "104", "MNT": "496", "MOP": "446", "MRU": "929", "MUR": "480", "MVR": "462",
    "MWK": "454", "MXN": "484", "MXV": "979", "MYR": "458", "MZN": "943", "NAD": "516",
    "NGN": "566", "NIO": "558", "NOK": "578", "NPR": "524", "NZD": "554", "OMR": "512",
    "PAB": "590", "PEN": "604", "PGK": "598", "PHP": "608", "PKR": "586", "PLN": "985",
    "PYG": "600", "QAR": "634", "RON": "946", "RSD": "941", "RUB": "643", "RWF": "646",
    "SAR": "682", "SBD": "090", "SCR": "690", "SDG": "938", "SEK": "752", "SGD": "702",
    "SHP": "654", "SLE": "925", "SLL": "694", "SOS": "706", "SRD": "968", "SSP": "728",
    "STN": "930", "SVC": "222", "SYP": "760", "SZL": "748", "THB": "764", "TJS": "972",
    "TMT": "934", "TND": "788", "TOP": "776", "TRY": "949", "TTD": "780", "TWD": "901",
    "TZS": "834", "UAH": "980", "UGX": "800", "USD": "840", "USN": "997", "UYI": "940",
    "UYU": "858", "UYW": "927", "UZS": "860", "VED": "926", "VES": "928", "VND": "704",
    "VUV": "548", "WST": "882", "XAF": "950", "XCD": "951", "XCG": "532", "XOF": "952",
    "XPF": "953", "YER": "886", "ZAR": "710", "ZMW": "967", "ZWG": "924", "ZWL": "932",
}  # fmt: skip

CURRENCY_ALPHA: dict[str, str] = {numeric: alpha for alpha, numeric in CURRENCY_NUMERIC.items()}


def currency_numeric(alpha: str) -> str:
    """Field 49 for an ISO 4217 alphabetic code (``"BRL"`` → ``"986"``)."""
    try:
        return CURRENCY_NUMERIC[alpha]
    except KeyError:
        raise UnsupportedCurrency(f"currency {alpha!r} has no ISO 4217 numeric code") from None


def currency_alpha(numeric: str) -> str:
    """The ISO 4217 alphabetic code for field 49 (``"986"`` → ``"BRL"``)."""
    try:
        return CURRENCY_ALPHA[numeric]
    except KeyError:
        raise UnsupportedCurrency(f"currency number {numeric!r} is not supported") from None

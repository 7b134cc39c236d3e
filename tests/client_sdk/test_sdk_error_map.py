"""The server's error codes and the SDK's exception map agree.

Every problem ``code`` the server can render (``api.errors.TITLES``) reaches a terminal on
the transaction endpoints — the HTTP layer's codes included, since they answer before any
route is chosen. Each one either raises its own SDK exception
(``client_sdk._exceptions.ERRORS_BY_CODE``) or is listed in ``GENERIC`` below with the
generic class it falls back on and why; and the SDK maps no code the server does not have.
Only this test imports the server: the SDK itself never does.
"""

from __future__ import annotations

import json

import pytest

from api.errors import TITLES, problem_body
from client_sdk import APIError, DuplicateGuardError, RequestInProgressError, ServerError
from client_sdk._exceptions import ERRORS_BY_CODE, error_from_response

# code → (status the server sends it with, the class the SDK raises, why not a specific one)
GENERIC: dict[str, tuple[int, type[APIError], str]] = {
    "method_not_allowed": (
        405,
        APIError,
        "the SDK only sends the methods the routes define: a 405 means a wrong base_url or "
        "a proxy rewriting requests — a configuration error, nothing a payment can act on",
    ),
    "malformed_request": (
        400,
        APIError,
        "httpx never sends invalid HTTP/1.1: only a broken middlebox produces it",
    ),
    "request_headers_too_large": (
        431,
        APIError,
        "the SDK's headers are few and of fixed size: only a middlebox adding headers produces it",
    ),
    "http_error": (
        400,
        APIError,
        "Starlette's fallback for an HTTP error no route raises (a 4xx of the HTTP layer): "
        "like malformed_request, only a broken middlebox produces it",
    ),
    "internal_error": (
        500,
        ServerError,
        "every 5xx is a ServerError: never stored under the key, so the protocol retries "
        "it with the same key; a separate class would add nothing to act on",
    ),
}


def test_every_server_code_is_mapped_or_deliberately_generic() -> None:
    unaccounted = set(TITLES) - set(ERRORS_BY_CODE) - set(GENERIC)
    assert not unaccounted, f"server codes the SDK neither maps nor lists as generic: {unaccounted}"


def test_every_code_the_sdk_maps_exists_on_the_server() -> None:
    unknown = set(ERRORS_BY_CODE) - set(TITLES)
    assert not unknown, f"SDK maps codes the server never sends: {unknown}"


def test_the_generic_list_holds_only_server_codes_the_sdk_does_not_map() -> None:
    assert set(GENERIC) <= set(TITLES)
    assert not set(GENERIC) & set(ERRORS_BY_CODE)
    assert all(reason for _, _, reason in GENERIC.values())


def test_each_mapped_code_has_its_own_specific_class() -> None:
    classes = list(ERRORS_BY_CODE.values())
    assert len(set(classes)) == len(classes), "two codes share one exception class"
    for code, error_type in ERRORS_BY_CODE.items():
        assert error_type not in (APIError, ServerError), code
        assert issubclass(error_type, APIError), code
        assert error_type.__name__.endswith("Error"), code


def _as_rendered(status: int, code: str) -> APIError:
    """The SDK's error for the problem body exactly as the server renders it."""
    body = json.loads(problem_body(status, code, f"detail of {code}"))
    return error_from_response(status, {"x-request-id": "req_1"}, body)


@pytest.mark.parametrize("code", sorted(ERRORS_BY_CODE))
def test_a_mapped_code_as_the_server_renders_it_raises_its_class(code: str) -> None:
    for status in (400, 410, 422, 503):  # the code decides, whatever the status
        error = _as_rendered(status, code)
        assert type(error) is ERRORS_BY_CODE[code]
        assert (error.code, error.status, error.detail) == (code, status, f"detail of {code}")


@pytest.mark.parametrize("code", sorted(GENERIC))
def test_a_generic_code_as_the_server_renders_it_falls_back_and_keeps_its_code(code: str) -> None:
    status, error_type, _ = GENERIC[code]
    error = _as_rendered(status, code)
    assert type(error) is error_type
    assert (error.code, error.status, error.request_id) == (code, status, "req_1")


def test_the_duplicate_guards_refusal_as_the_server_renders_it_names_the_earlier_payment() -> None:
    # 409 is also request_in_progress (a key in flight): the code, not the status, decides
    # that the SDK fences the key and raises SuspectedDuplicateError (contract §4.13).
    earlier = "01a1ee56-5e00-7d97-86ac-d904da6cff77"
    rendered = problem_body(409, "suspected_duplicate", "seen", {"duplicate_of": earlier})
    error = error_from_response(409, {}, json.loads(rendered))
    assert type(error) is DuplicateGuardError
    assert (error.code, error.duplicate_of) == ("suspected_duplicate", earlier)
    busy = json.loads(problem_body(409, "request_in_progress", "busy"))
    assert type(error_from_response(409, {}, busy)) is RequestInProgressError

"""The duplicate guard at the counter, the SDK's side (contract §4.13; issue 17 part 3).

A create the merchant's guard suspects answers 409 ``suspected_duplicate`` with
``duplicate_of``; nothing is stored under the key. Unlike 409 ``request_in_progress`` it is
not a key in flight: the SDK fences the key (a late copy of an earlier attempt must never be
processed once the earlier transaction leaves the window), then reports
``SuspectedDuplicateError`` — or the transaction, when the abort finds the key processed.
``purchase(..., allow_duplicate=True)`` is the cashier's override."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest
from fake_idempay import CARD, FakeIdempay, _json, _problem, _transaction

from client_sdk import (
    AsyncClient,
    Client,
    DuplicateGuardError,
    JournalState,
    PaymentAbortedError,
    PaymentInDoubtError,
    SuspectedDuplicateError,
    Transaction,
)
from client_sdk._actions import Phase, Reject, Retry, next_action
from client_sdk._effects import HttpReply
from client_sdk._settle import settled_outcome

MakeClient = Callable[..., Client]
MakeAsyncClient = Callable[..., AsyncClient]
NOW = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)
EARLIER = "01a1ee56-5e00-7d97-86ac-d904da6cff77"
SALE = {"amount": 1250, "currency": "BRL", "card": CARD, "deadline_s": 30}


def _guard_problem(**extra: object) -> dict[str, object]:
    problem = {"status": 409, "code": "suspected_duplicate", "detail": "the same card"}
    return {**problem, **extra}


# --- the decision (pure) ----------------------------------------------------------------


def test_a_suspected_duplicate_is_a_refusal_not_a_key_in_flight() -> None:
    reply = HttpReply(409, {"x-request-id": "req_9"}, _guard_problem(duplicate_of=EARLIER))
    action = next_action(Phase.CREATE, reply, now=NOW)
    assert isinstance(action, Reject)
    assert type(action.error) is DuplicateGuardError
    assert (action.error.code, action.error.status, action.error.request_id) == (
        "suspected_duplicate",
        409,
        "req_9",
    )
    assert action.error.duplicate_of == EARLIER


@pytest.mark.parametrize(
    "body",
    [
        {"code": "request_in_progress", "status": 409, "title": "In progress"},
        None,  # a proxy's 409 without a problem body: still in doubt
        {"code": "something_new", "status": 409},  # an unknown 409: in doubt, never a refusal
    ],
)
def test_any_other_409_on_create_still_means_in_flight(body: object) -> None:
    action = next_action(Phase.CREATE, HttpReply(409, {"retry-after": "1"}, body), now=NOW)
    assert action == Retry(Phase.LOOKUP, 1.0, True)


def test_the_guard_answer_without_duplicate_of_still_refuses() -> None:
    action = next_action(Phase.CREATE, HttpReply(409, {}, _guard_problem()), now=NOW)
    assert isinstance(action, Reject) and isinstance(action.error, DuplicateGuardError)
    assert action.error.duplicate_of is None


# --- through the clients, against the fake with its guard on -----------------------------


@pytest.fixture
def guarded(make_client: MakeClient, fake: FakeIdempay) -> Client:
    """A client of a merchant whose duplicate guard is on."""
    fake.guard = True
    return make_client()


def _sold_twice(client: Client) -> tuple[Transaction, SuspectedDuplicateError]:
    """The same sale rung up twice under the guard: the first payment, the second's error."""
    first = client.purchase(**SALE)
    with pytest.raises(SuspectedDuplicateError) as caught:
        client.purchase(**SALE)
    return first, caught.value


def test_a_suspected_duplicate_fences_the_key_and_names_the_earlier_payment(
    guarded: Client, fake: FakeIdempay
) -> None:
    first, refused = _sold_twice(guarded)
    error = refused
    assert isinstance(error, PaymentAbortedError)  # callers catching the abort family
    assert (error.code, error.status, error.reason) == ("suspected_duplicate", 409, "aborted")
    assert error.duplicate_of == first.id and error.key != first.id
    assert isinstance(error.__cause__, DuplicateGuardError)
    assert [s.endpoint for s in fake.seen] == ["create", "create", "abort"]
    assert fake.keys[error.key].state == "aborted"  # a late copy of it now gets 410
    assert fake.processed[error.key] == 0
    entry = guarded.journal.get(error.key)
    assert entry is not None and entry.state is JournalState.ABORTED
    assert entry.outcome is not None and entry.outcome["duplicate_of"] == first.id


async def test_the_async_client_fences_and_raises_the_same(
    make_async_client: MakeAsyncClient, fake: FakeIdempay
) -> None:
    fake.guard = True
    async with make_async_client() as client:
        first = await client.purchase(**SALE)
        with pytest.raises(SuspectedDuplicateError) as caught:
            await client.purchase(**SALE)
        assert caught.value.duplicate_of == first.id
        entry = client.journal.get(caught.value.key)
    assert [s.endpoint for s in fake.seen] == ["create", "create", "abort"]
    assert fake.keys[caught.value.key].state == "aborted"
    assert entry is not None and entry.state is JournalState.ABORTED


def test_the_cashiers_override_sells_under_a_new_key(guarded: Client, fake: FakeIdempay) -> None:
    first, refused = _sold_twice(guarded)
    again = guarded.purchase(**SALE, allow_duplicate=True)
    assert again.status == "approved"
    assert len({first.id, refused.key, again.id}) == 3
    bodies = [s.body for s in fake.calls("create")]
    assert [body.get("allow_duplicate") for body in bodies] == [None, None, True]
    assert fake.processed[again.id] == 1


async def test_the_async_override_sends_allow_duplicate(
    make_async_client: MakeAsyncClient, fake: FakeIdempay
) -> None:
    fake.guard = True
    async with make_async_client() as client:
        await client.purchase(**SALE)
        again = await client.purchase(**SALE, allow_duplicate=True)
    assert again.status == "approved"
    assert fake.calls("create")[-1].body["allow_duplicate"] is True


def test_refunds_are_not_guarded_and_take_no_override(guarded: Client) -> None:
    guarded.refund(**SALE)
    assert guarded.refund(**SALE).status == "approved"
    with pytest.raises(TypeError, match="allow_duplicate"):
        guarded.refund(**SALE, allow_duplicate=True)  # type: ignore[call-arg]


def test_a_second_driver_finds_the_refusal_settled(guarded: Client) -> None:
    first, refused = _sold_twice(guarded)
    entry = guarded.journal.get(refused.key)
    assert entry is not None
    with pytest.raises(SuspectedDuplicateError) as again:
        settled_outcome(entry)
    assert (again.value.key, again.value.duplicate_of) == (refused.key, first.id)


# --- what the abort finds decides (scripted server) ---------------------------------------


def _scripted(abort: Callable[[str, dict[str, object]], httpx.Response]) -> httpx.MockTransport:
    """Creates answer 409 suspected_duplicate; the abort answers what ``abort`` says."""
    sent: dict[str, dict[str, object]] = {}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return _json(200, {"status": "ok"})
        if request.url.path == "/v1/transactions":
            sent[request.headers["idempotency-key"]] = json.loads(request.content)
            return _problem(409, "suspected_duplicate", duplicate_of=EARLIER)
        key = request.url.path.split("/")[3]
        return abort(key, sent[key])

    return httpx.MockTransport(handle)


def test_an_abort_that_finds_the_key_processed_returns_that_payment(
    make_client: MakeClient,
) -> None:
    # An earlier attempt of this key was processed meanwhile: the abort says so, and that
    # is the payment's result, as for any abort (contract §4.4).
    def processed(key: str, body: dict[str, object]) -> httpx.Response:
        return _json(200, _transaction(key, body), {"Idempotency-Status": "processed"})

    client = make_client(transport=_scripted(processed))
    result = client.purchase(**SALE)
    assert result.status == "approved"
    entry = client.journal.get(result.id)
    assert entry is not None and entry.state is JournalState.RESOLVED


async def test_the_async_client_returns_the_processed_payment_too(
    make_async_client: MakeAsyncClient,
) -> None:
    def processed(key: str, body: dict[str, object]) -> httpx.Response:
        return _json(200, _transaction(key, body), {"Idempotency-Status": "processed"})

    async with make_async_client(transport=_scripted(processed)) as client:
        result = await client.purchase(**SALE)
    assert result.status == "approved"


def test_an_abort_that_cannot_land_leaves_the_payment_in_doubt(
    make_client: MakeClient,
) -> None:
    def unreachable(key: str, body: dict[str, object]) -> httpx.Response:
        return _problem(503, "service_unavailable", retry_after="1")

    client = make_client(transport=_scripted(unreachable))
    with pytest.raises(PaymentInDoubtError) as caught:
        client.purchase(**SALE)
    assert isinstance(caught.value.__cause__, DuplicateGuardError)
    entry = client.journal.get(caught.value.key)
    assert entry is not None and entry.state is JournalState.IN_DOUBT  # recover() settles it


# --- the arguments are one definition for both clients -----------------------------------


WRONG_KEYWORDS = pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"amount": 1250, "currency": "BRL"}, "missing keyword arguments: card"),
        ({**SALE, "amount_minor": 1}, "unexpected keyword arguments: amount_minor"),
    ],
)


@WRONG_KEYWORDS
def test_a_wrong_keyword_is_a_type_error(
    make_client: MakeClient, fake: FakeIdempay, arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        make_client().purchase(**arguments)  # type: ignore[arg-type]
    assert fake.wire == []  # refused before anything was sent (or journaled)


@WRONG_KEYWORDS
async def test_a_wrong_keyword_is_a_type_error_in_the_async_client_too(
    make_async_client: MakeAsyncClient,
    fake: FakeIdempay,
    arguments: dict[str, object],
    message: str,
) -> None:
    async with make_async_client() as client:
        with pytest.raises(TypeError, match=message):
            await client.purchase(**arguments)  # type: ignore[arg-type]
    assert fake.wire == []

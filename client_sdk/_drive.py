"""Running one drive of one journal entry under its lease: ``driven`` gives the lease back
however the drive ends, and turns whatever went wrong after the entry was journaled into an
``IdempayError`` (``as_error``)."""

from __future__ import annotations

import contextlib

from ._context import Run, SettledElsewhere
from ._effects import Release, Steps
from ._exceptions import IdempayError, PaymentInDoubtError
from ._journal import end_drive
from ._models import Transaction
from ._settle import settled_outcome

__all__ = ["as_error", "driven"]


def driven(run: Run, owner: str, steps: Steps[Transaction]) -> Steps[Transaction]:
    """Run ``steps`` holding the key's lease; give it back however they end. A key settled
    meanwhile by another driver answers with that driver's outcome."""
    failure: Exception | None = None
    result: Transaction | None = None
    try:
        result = yield from steps
    except SettledElsewhere as settled:
        try:
            result = settled_outcome(settled.entry)
        except IdempayError as exc:
            failure = exc
    except Exception as exc:
        failure = as_error(exc, run.key)
    except BaseException:  # cancelled, interrupted, closed unfinished: no effect can run now
        end_drive(owner)  # the lease stays in the file, but no live driver holds it
        raise
    with contextlib.suppress(Exception):  # best effort: a lease also ends with its time
        yield Release(run.key, owner)
    if failure is not None:
        raise failure
    assert result is not None
    return result


def as_error(exc: Exception, key: str) -> IdempayError:
    """Anything unexpected after a payment was journaled leaves it in doubt."""
    if isinstance(exc, IdempayError):
        return exc
    doubt = PaymentInDoubtError(
        f"payment {key}: {type(exc).__name__}: {exc}; the journal keeps it for recover()",
        key=key,
    )
    doubt.__cause__ = exc
    return doubt

"""One Locust ``request`` event per end-to-end payment (not per HTTP round trip)."""

from __future__ import annotations

import time
from typing import Any

PAY = "PAY"


def fire_payment(
    environment: Any, name: str, started: float, exception: BaseException | None
) -> None:
    environment.events.request.fire(
        request_type=PAY,
        name=name,
        response_time=(time.perf_counter() - started) * 1000,
        response_length=0,
        exception=exception,
        context={},
    )

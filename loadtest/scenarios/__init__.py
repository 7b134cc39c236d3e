"""Locust scenarios of a terminal fleet (imported by ``loadtest/locustfile.py``).

| user class       | what it drives                                                        |
|------------------|-----------------------------------------------------------------------|
| ``LossyTerminal``  | raw HTTP; a lost response is resolved by a lookup by key, never a new key |
| ``SdkTerminal``    | the real ``client_sdk.Client`` (journal, retries, in-doubt resolution)  |
| ``DuplicateStorm`` | a few hot keys hammered with identical creates (201 replay or 409)      |
| ``InDoubtStorm``   | a batch of keys, then a lookup-heavy storm over them after an outage    |

Every user reads its API key from ``IDEMPAY_API_KEY`` and the server from ``--host``.
"""

from loadtest.scenarios.lossy import LossyTerminal
from loadtest.scenarios.sdk import SdkTerminal
from loadtest.scenarios.storms import DuplicateStorm, InDoubtStorm

__all__ = ["DuplicateStorm", "InDoubtStorm", "LossyTerminal", "SdkTerminal"]

"""Signed webhooks from the outbox (issue 17, part 2).

``endpoints``  a merchant's receivers: add, list, remove; dead letters; replay of a time range
``queue``      the delivery queue: fan-out of numbered outbox events, the head of each
               endpoint's queue, the outcome of an attempt (backoff, dead letter)
``signing``    the ``Idempay-Signature`` header (HMAC-SHA256 over ``t.body``) and its check
``worker``     ``idempay webhooks``: delivers every event at least once, in ``seq`` order
               per endpoint
"""

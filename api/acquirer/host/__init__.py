"""The simulated acquirer host (SPEC §2.9): its own process and its own store.

``server`` (the ISO 8583 TCP server), ``book`` (the rules by RRN and the test tokens),
``store`` (SQLite, and the read API the invariant checkers use), ``committer`` (group
commit), ``faults`` + ``control`` (fault injection and its control socket), ``clearing``
(the daily clearing file), ``process`` (the host as a child process), ``cli``.
Nothing heavy is imported here: the server's CLI mounts ``cli`` at start.
"""

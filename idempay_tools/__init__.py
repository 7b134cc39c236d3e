"""idempay's tooling, beside the server: the terminal fleet simulator (``idempay simulate``),
the contract §8 invariant checker, the demo, the Spark audit and lake CLI, the server launcher
the harnesses share, and the chaos harness with its proxy.

Depends on ``api``, ``client_sdk`` and ``analytics``; ``api`` never imports it, and it
never imports ``loadtest`` (the contract in pyproject.toml, ``[tool.importlinter]``).
"""

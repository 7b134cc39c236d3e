"""The package surface: an explicit __all__, and nothing but the stdlib and httpx."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import client_sdk

HTTPX_STACK = {
    "httpx",
    "httpcore",
    "anyio",
    "sniffio",
    "certifi",
    "idna",
    "h11",
    "h2",
    "hpack",
    "hyperframe",
    "brotli",
    "_brotli",
    "brotlicffi",
    "zstandard",
    "socksio",
    "typing_extensions",
    "exceptiongroup",
    "charset_normalizer",
}
FORBIDDEN = {
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic_core",
    "sqlalchemy",
    "redis",
    "asyncpg",
    "aiosqlite",
    "alembic",
    "uvicorn",
    "pyspark",
    "locust",
    "api",
}

# httpx itself imports its optional CLI extras when they happen to be installed
HTTPX_CLI_EXTRAS = {"click", "rich", "pygments", "markdown_it", "mdurl"}

PROBE = """
import json, sys
before = set(sys.modules)
import httpx
with_httpx = set(sys.modules)
import client_sdk, client_sdk.faults
print(json.dumps({"httpx": sorted(with_httpx - before),
                  "sdk": sorted(set(sys.modules) - with_httpx)}))
"""


def _top_level(names: list[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_importing_the_sdk_loads_only_the_stdlib_and_httpx() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = json.loads(out)
    by_httpx, by_sdk = _top_level(loaded["httpx"]), _top_level(loaded["sdk"])
    assert "httpx" in by_httpx and "client_sdk" in by_sdk
    assert not (by_httpx | by_sdk) & FORBIDDEN
    stdlib = set(sys.stdlib_module_names)
    assert by_sdk - stdlib == {"client_sdk"}
    assert by_httpx - stdlib - HTTPX_STACK - HTTPX_CLI_EXTRAS == set()


def test_all_is_explicit_sorted_and_complete() -> None:
    exported = client_sdk.__all__
    assert exported == sorted(exported)
    assert all(hasattr(client_sdk, name) for name in exported)
    public = {
        name
        for name, value in vars(client_sdk).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)


def test_private_modules_declare_their_exports() -> None:
    from client_sdk import _client, _exceptions, _journal, _models, _retry

    for module in (_client, _exceptions, _journal, _models, _retry):
        assert all(hasattr(module, name) for name in module.__all__)

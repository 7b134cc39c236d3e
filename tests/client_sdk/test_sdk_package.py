"""The package surface: an explicit __all__, and nothing but the stdlib and httpx."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import types

import httpx

import client_sdk
import client_sdk.faults

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
    from client_sdk import _base_client, _client, _exceptions, _journal, _models, _retry

    for module in (_base_client, _client, _exceptions, _journal, _models, _retry):
        assert all(hasattr(module, name) for name in module.__all__)


def test_the_public_surface_includes_the_new_names() -> None:
    for name in (
        "RetryPolicy",
        "PaymentAbortedError",
        "PaymentInDoubtError",
        "NotFoundError",
        "ClockSkewError",
        "RequestTimeoutError",
    ):
        assert name in client_sdk.__all__, name
    assert client_sdk.RetryPolicy is client_sdk._retry.RetryPolicy


def test_every_exception_is_named_error_or_is_a_deprecated_alias_of_one() -> None:
    for name in client_sdk.__all__:
        value = getattr(client_sdk, name)
        if not (isinstance(value, type) and issubclass(value, BaseException)):
            continue
        if value.__name__ == name:
            assert name.endswith("Error"), name
        else:  # an alias: the old name of a class exported under its *Error name
            assert value.__name__ == f"{name}Error", name
            assert value.__name__ in client_sdk.__all__, name
            assert f"``{name}``" in (client_sdk._exceptions.__doc__ or ""), name


def test_the_faults_module_exports_one_transport_for_both_modes() -> None:
    faults = client_sdk.faults
    assert faults.__all__ == sorted(faults.__all__)
    assert set(faults.__all__) == {"AsyncFaultyTransport", "FaultTransport", "FaultyTransport"}
    assert faults.FaultyTransport is faults.AsyncFaultyTransport is faults.FaultTransport
    assert issubclass(faults.FaultTransport, httpx.BaseTransport)
    assert issubclass(faults.FaultTransport, httpx.AsyncBaseTransport)


def _public_members(cls: type) -> list[str]:
    names = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property | classmethod | staticmethod) or inspect.isfunction(member):
            names.append(name)
    return names


def _documented(cls: type, name: str) -> bool:
    member = vars(cls)[name]
    if isinstance(member, property):
        member = member.fget
    elif isinstance(member, classmethod | staticmethod):
        member = member.__func__
    return bool(getattr(member, "__doc__", None))


def test_every_public_class_and_method_has_a_docstring() -> None:
    undocumented = []
    surface = [(client_sdk, n) for n in client_sdk.__all__]
    surface += [(client_sdk.faults, n) for n in client_sdk.faults.__all__]
    for module, name in surface:
        value = getattr(module, name)
        if inspect.isclass(value):
            if not value.__dict__.get("__doc__"):
                undocumented.append(name)
            undocumented += [
                f"{name}.{member}"
                for member in _public_members(value)
                if not _documented(value, member)
            ]
        elif inspect.isfunction(value) and not value.__doc__:
            undocumented.append(name)
    assert undocumented == []


def test_the_package_docstring_notes_what_is_deprecated() -> None:
    doc = client_sdk.__doc__ or ""
    for name in ("base_backoff", "max_backoff", "max_retries", "RetryPolicy", "PaymentAborted"):
        assert name in doc, name

"""Fixtures for running deploy/'s commands here: a private Postgres database migrated by the
migration Job's own command line, and a private Redis key prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.manifests import (
    DEPLOY,
    clean_environ,
    compose,
    compose_argv,
    container,
    container_env,
    dockerfile_stages,
    find,
    k8s_argv,
    render_local,
)
from tests.deploy.running import (
    COMPOSE_ENV,
    SHARED_REDIS,
    image_env,
    overrides,
    run_to_the_end,
)
from tests.support.services import (
    clean_redis_prefix,
    create_database,
    drop_database,
    pg_url,
    shared_redis_prefix,
)


@pytest.fixture(scope="session")
def redis_prefix() -> Iterator[str]:
    prefix = shared_redis_prefix()
    try:
        yield prefix
    finally:
        clean_redis_prefix(SHARED_REDIS, prefix)


@pytest.fixture(scope="session")
def deployed_db(tmp_path_factory: pytest.TempPathFactory, redis_prefix: str) -> Iterator[str]:
    """A private database, migrated by running the migration Job's command line (the same
    as the compose `migrate` service's) with the Job's environment."""
    name = create_database(prefix="idempay_deploy")
    url = pg_url(name)
    try:
        docs = render_local()
        job = find(docs, "Job", "idempay-migrate")
        spec = container(job, "migrate")
        entrypoint = dockerfile_stages(DEPLOY / "Dockerfile")[-1].exec_form("ENTRYPOINT")
        argv = k8s_argv(spec, entrypoint)
        assert argv == ["idempay", "migrate"]
        assert compose_argv(compose(COMPOSE_ENV)["services"]["migrate"], entrypoint) == argv
        env = {
            **clean_environ(),
            **image_env(),
            **container_env(docs, job, spec),
            **overrides(url, redis_prefix),
        }
        stdout = run_to_the_end(argv, env, tmp_path_factory.mktemp("migrate"))
        assert f"migrated {url.split('@')[-1]}" in stdout
        yield url
    finally:
        drop_database(name)

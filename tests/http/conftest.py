"""Real Caravan clusters for the HTTP API tests: started once per session, always torn down."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.http.support import HTTPCluster, start_cluster, stop_cluster

# Short event-stream heartbeats so framing tests see several within seconds.
FAST_HEARTBEAT = 'http_event_heartbeat = "300ms"\n'


@pytest.fixture(scope="session")
def http_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPCluster]:
    """Three servers shared by the contract tests (each test uses its own job ids)."""
    c = start_cluster(tmp_path_factory.mktemp("http"), 3, FAST_HEARTBEAT)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="session")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPCluster]:
    """Three servers whose ACLs the tests bootstrap (through HTTP, once)."""
    c = start_cluster(tmp_path_factory.mktemp("http-acl"), 3, FAST_HEARTBEAT)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture
def cluster_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., HTTPCluster]]:
    """Dedicated clusters (a tiny journal, one server); stopped after the test."""
    started: list[HTTPCluster] = []

    def make(nodes: int = 1, extra_config: str = "") -> HTTPCluster:
        c = start_cluster(tmp_path_factory.mktemp("http-own"), nodes, FAST_HEARTBEAT + extra_config)
        started.append(c)
        return c

    try:
        yield make
    finally:
        for c in started:
            stop_cluster(c)

"""Laying out a local cluster directory: addresses survive a restart of the directory."""

from __future__ import annotations

import socket
from pathlib import Path

from node import devcluster as cl


def _addresses(c: cl.Cluster) -> list[str]:
    return [a for n in c.nodes for a in (n.rpc_addr, n.raft_addr, n.http_address)]


def test_a_directory_planned_again_keeps_its_addresses(tmp_path: Path) -> None:
    first = cl.plan(str(tmp_path), 3)
    first.save()
    again = cl.plan(str(tmp_path), 3)
    assert _addresses(again) == _addresses(first)
    assert len(set(_addresses(again))) == 9


def test_an_address_taken_meanwhile_is_replaced_and_the_others_kept(tmp_path: Path) -> None:
    first = cl.plan(str(tmp_path), 3)
    first.save()
    host, port = first.nodes[1].raft_addr.split(":")
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()
        again = cl.plan(str(tmp_path), 3)
    assert again.nodes[1].raft_addr != first.nodes[1].raft_addr
    kept = [a for a in _addresses(first) if a != first.nodes[1].raft_addr]
    assert [a for a in _addresses(again) if a != again.nodes[1].raft_addr] == kept
    assert len(set(_addresses(again))) == 9
    # every server's config names the new address for that peer
    assert all(again.nodes[1].raft_addr in Path(n.config_file).read_text() for n in again.nodes)


def test_growing_a_directory_keeps_the_old_servers_addresses(tmp_path: Path) -> None:
    first = cl.plan(str(tmp_path), 3)
    first.save()
    grown = cl.plan(str(tmp_path), 5)
    assert _addresses(grown)[:9] == _addresses(first)
    assert len(set(_addresses(grown))) == 15


def test_an_unreadable_cluster_file_means_fresh_addresses(tmp_path: Path) -> None:
    (tmp_path / cl.CLUSTER_FILE).write_text("{not json")
    c = cl.plan(str(tmp_path), 3)
    assert len(set(_addresses(c))) == 9

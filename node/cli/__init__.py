"""The ``caravan`` command line.

People get tables; scripts get ``--json`` with Nomad's field names. Every
failure is one line on stderr and a non-zero exit, never a traceback.

One module per command group; this one only gathers them under ``main``
(the ``caravan`` console script and ``python -m node.cli``). Shared
plumbing is in ``node.cli.common``.
"""

from __future__ import annotations

import click

from node.cli.acl import acl_group
from node.cli.agent import agent
from node.cli.allocs import alloc
from node.cli.client import client_group
from node.cli.cluster import cluster, dev
from node.cli.common import CaravanGroup
from node.cli.deployments import deployment
from node.cli.evals import eval_
from node.cli.event import event
from node.cli.job import job
from node.cli.nodes import node
from node.cli.operator import operator
from node.cli.queue import priority_class_group, queue_group
from node.cli.server import server_group
from node.cli.system import debug, system

__all__ = ["main"]


@click.group(cls=CaravanGroup)
def main() -> None:
    """Caravan: a Raft-replicated control plane modeled on Nomad's servers."""


for _command in (agent, dev, cluster, job, eval_, alloc, deployment, node, client_group, acl_group, operator,
                 event, debug, system, server_group, queue_group, priority_class_group):
    main.add_command(_command)

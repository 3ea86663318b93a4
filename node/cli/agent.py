"""``caravan agent``: run one server in the foreground.

The server's own modules are imported only when this command runs, so the
client commands start without loading a whole server.
"""

from __future__ import annotations

import sys

import click

from node.cli.common import fail


@click.command()
@click.option("--config", "config_file", required=True, type=click.Path(dir_okay=False), help="Server TOML config.")
def agent(config_file: str) -> None:
    """Run one server in the foreground."""
    from node.core.config import ConfigError, ServerConfig
    from node.core.logs import configure_logging
    from node.server import run_server

    try:
        config = ServerConfig.load(config_file)
    except ConfigError as exc:
        fail(str(exc))
    configure_logging(config)
    sys.exit(run_server(config))

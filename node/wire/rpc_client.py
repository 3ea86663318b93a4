"""RPC clients: a blocking one for the CLI and tests, an asyncio one for servers.

This module is the clients' front door; the parts live beside it:

- ``retry``: the retry and leader-following policy both clients follow (the
  rules are listed there), written once as a plan of steps;
- ``sync_client``: ``RPCClient``, performing that plan with blocking sockets;
- ``async_client``: ``AsyncRPCClient``, performing it with asyncio;
- ``async_connection``: the asyncio client's pipelined connection per server;
- ``client_base``, ``messages``: how a call starts, and how answers read.

Streams (``stream``) use a connection of their own, so a slow consumer
pushes back on its own stream only, and closing the iterator early simply
closes that connection. A stream is not resumed after it started: its
consumer knows where it stopped (the journal's index) and resubscribes.
"""

from __future__ import annotations

from node.wire.async_client import AsyncRPCClient
from node.wire.client_base import DEFAULT_TOKEN
from node.wire.retry import BACKOFF_FIRST, BACKOFF_MAX, DEFAULT_TIMEOUT
from node.wire.sync_client import RPCClient

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TOKEN",
    "AsyncRPCClient",
    "RPCClient",
]

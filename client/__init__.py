"""Simulated client nodes (``caravan client sim``) and the ``sim`` task driver.

Talks to servers only through the RPC client, never by importing server
internals (DESIGN.md's import rule).
"""

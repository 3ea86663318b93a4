"""``caravan acl``: bootstrap, tokens and policies.

A token's secret is printed only where the server returned it (create and
bootstrap); the servers keep it hashed, so later reads cannot show it.
"""

from __future__ import annotations

from typing import Any

import click

from node.cli.common import TTL, blocking_options, client_options, emit, kv, make_ctx, when
from node.cli.paging import emit_list, list_options


@click.group("acl")
def acl_group() -> None:
    """ACL bootstrap, tokens and policies."""


def _token_table(d: dict[str, Any]) -> str:
    """Nomad's token layout; the secret only where the server returned it
    (create and bootstrap: it is stored hashed, so later reads cannot)."""
    shown = {**d, "Create Time": when(d.get("CreateTime") or 0),
             "Expiry Time": when(d.get("ExpirationTime") or 0) or "<none>"}
    fields = [("Accessor ID", "AccessorID"), ("Secret ID", "SecretID"), ("Name", "Name"), ("Type", "Type"),
              ("Policies", "Policies"), ("Create Time", "Create Time"), ("Expiry Time", "Expiry Time"),
              ("Create Index", "CreateIndex")]
    return kv(shown, [f for f in fields if f[1] != "SecretID" or d.get("SecretID")])


@acl_group.command("bootstrap")
@client_options
def acl_bootstrap(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Create the initial management token (once per cluster)."""
    c = make_ctx(address, token, as_json)
    emit(c, c.call("acl.bootstrap"), _token_table)


@acl_group.group("token")
def acl_token() -> None:
    """Manage ACL tokens (management token required)."""


@acl_token.command("create")
@click.option("--name", default="")
@click.option("--type", "kind", type=click.Choice(["client", "management"]), default="client", show_default=True)
@click.option("--policy", "policies", multiple=True,
              help="An ACL policy the token carries (repeat for more); read and write are built in.")
@click.option("--ttl", "ttl", type=TTL, default="0", help="Expire after this long: a duration (30m, 24h) or seconds; 0: never.")
@client_options
def acl_token_create(name: str, kind: str, policies: tuple[str, ...], ttl: int, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json)
    out = c.call("acl.token.create", {"name": name, "type": kind, "policies": list(policies), "ttl_seconds": ttl})
    emit(c, out, _token_table)


@acl_token.command("list")
@list_options
@blocking_options
@client_options
def acl_token_list(filter_expr: str | None, per_page: int | None, page_token: str | None,
                   address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """ACL tokens, every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    columns = [("Name", "Name"), ("Type", "Type"), ("Accessor ID", "AccessorID"), ("Policies", "Policies")]
    emit_list(c, "acl.token.list", {}, columns, filter_expr=filter_expr, per_page=per_page, page_token=page_token)


@acl_token.command("info")
@click.argument("accessor_id")
@blocking_options
@client_options
def acl_token_info(accessor_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("acl.token.get", {"accessor_id": accessor_id}), _token_table)


@acl_token.command("self")
@client_options
def acl_token_self(address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("acl.token.self"), _token_table)


@acl_token.command("delete")
@click.argument("accessor_id")
@client_options
def acl_token_delete(accessor_id: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    c = make_ctx(address, token, as_json)
    out = c.call("acl.token.delete", {"accessor_id": accessor_id})
    emit(c, out, lambda d: f"Token {accessor_id} deleted at index {d['Index']}")


@acl_group.group("policy")
def acl_policy() -> None:
    """Manage ACL policies: named rules that tokens carry (management token required)."""


@acl_policy.command("apply")
@click.option("--description", default="", help="What the policy is for.")
@click.argument("name")
@click.argument("rules_file", type=click.File("r"))
@client_options
def acl_policy_apply(description: str, name: str, rules_file: Any, address: str, token: str | None,
                     as_json: bool, stale: bool) -> None:
    """Create or replace policy NAME from RULES_FILE (Nomad's HCL or JSON rules; - reads stdin)."""
    c = make_ctx(address, token, as_json)
    out = c.call("acl.policy.upsert", {"name": name, "description": description, "rules": rules_file.read()})
    emit(c, out, lambda d: f"Successfully wrote {name!r} ACL policy (index {d['Index']})")


@acl_policy.command("list")
@list_options
@blocking_options
@client_options
def acl_policy_list(filter_expr: str | None, per_page: int | None, page_token: str | None,
                    address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """ACL policies, every page as it arrives."""
    c = make_ctx(address, token, as_json, stale)
    columns = [("Name", "Name"), ("Description", "Description")]
    emit_list(c, "acl.policy.list", {}, columns, filter_expr=filter_expr, per_page=per_page, page_token=page_token)


def _policy_table(d: dict[str, Any]) -> str:
    head = kv(d, [("Name", "Name"), ("Description", "Description"), ("CreateIndex", "CreateIndex"),
                  ("ModifyIndex", "ModifyIndex")])
    return f"{head}\n\nRules\n\n{d.get('Rules', '').rstrip()}"


@acl_policy.command("info")
@click.argument("name")
@blocking_options
@client_options
def acl_policy_info(name: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Policy NAME with its rules as written."""
    c = make_ctx(address, token, as_json, stale)
    emit(c, c.read("acl.policy.get", {"name": name}), _policy_table)


@acl_policy.command("delete")
@click.argument("name")
@client_options
def acl_policy_delete(name: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Delete policy NAME; tokens that name it lose its rules."""
    c = make_ctx(address, token, as_json)
    out = c.call("acl.policy.delete", {"name": name})
    emit(c, out, lambda d: f"Successfully deleted {name!r} ACL policy (index {d['Index']})")

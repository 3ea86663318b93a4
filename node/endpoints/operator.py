"""RPC methods for the scheduler configuration (Nomad's ``Operator.SchedulerGet/SetConfiguration``).

The configuration is the placement policy (``fsm.scheduler_config``),
answered and taken in Nomad's JSON shape (``scheduler.policy_json``). Reads
need a read token and take ``stale`` (any server's local state) and blocking
queries; writes need a management token. A bad policy is refused here with
the one line apply would give, before it reaches the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm import messages as m
from fsm.scheduler_config import CONFIG_TABLE
from fsm.store import StateReader
from node.core.acl import Need
from node.core.context import RequestContext
from node.endpoints.registry import arg, bad, method
from scheduler.policy import PolicyError
from scheduler.policy_json import config_from_json, config_json

if TYPE_CHECKING:
    from node.core.api import ServerAPI


def _config_view(reader: StateReader) -> dict[str, Any]:
    return {"SchedulerConfig": config_json(reader.scheduler_config())}


@method("operator.scheduler.get_config")
async def scheduler_get_config(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """{"index", "data": {"SchedulerConfig": ...}}; the index is the raft index that last set it (1 if never)."""
    return await server.read(ctx, args, (CONFIG_TABLE,), _config_view, point=True)


@method("operator.scheduler.set_config")
async def scheduler_set_config(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Replace the configuration with ``config`` (a whole one, as Nomad's PUT); ``cas_index``: only if unchanged.

    Answers Nomad's SchedulerSetConfigurationResponse, ``{"Updated", "Index"}``,
    plus the stored ``ModifyIndex`` (the one to pass as ``cas_index`` next).
    """
    server.ensure_leader()
    await server.authorize(ctx, Need.MANAGEMENT)  # before looking at the body: no token, no hints
    cas_index = arg(args, "cas_index", int, required=False)
    if cas_index is not None and cas_index < 0:
        raise bad("argument 'cas_index' must be >= 0 (0: only if the configuration was never set)")
    try:
        config = config_from_json(args.get("config"))
    except PolicyError as exc:
        raise bad(str(exc)) from None
    result = await server.write(ctx, Need.MANAGEMENT, m.SchedulerConfigSet(config=config, cas_index=cas_index))
    value = result["value"]
    return {"Updated": value["updated"], "Index": result["index"], "ModifyIndex": value["modify_index"]}

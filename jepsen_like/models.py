"""Sequential specifications the linearizability checker compares histories against.

A model is a pure state machine: the checker explores many interleavings and
memoizes (linearized set, state) pairs, so states must be immutable and
hashable, and ``step`` must not mutate anything.

Operation encodings (plain dicts, so they survive a JSONL round trip):

* register: input ``{"f": "read"}`` -> output value (``None`` = nil);
  ``{"f": "write", "value": v}`` -> output ignored;
  ``{"f": "cas", "from": a, "to": b}`` -> output ``True`` (swapped) or
  ``False`` (compare failed, a definite answer that the value was not ``a``).
* key-value: input ``{"f": "get"|"put"|"append", "key": k, "value": v}``;
  ``get`` outputs the string, ``put``/``append`` outputs are ignored.

Any output may be ``UNKNOWN`` (an ``info`` operation), which every model accepts.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from jepsen_like.history import UNKNOWN, Operation

State = TypeVar("State", bound=Hashable)


class Model(Protocol[State]):
    """What the checker needs to know about the object under test."""

    def init(self) -> State:
        """State before any operation."""
        ...

    def step(self, state: State, input: Any, output: Any) -> tuple[bool, State]:
        """Whether ``input`` applied to ``state`` may yield ``output``, and the next state."""
        ...

    def partition(self, history: Sequence[Operation]) -> list[list[Operation]]:
        """Split into independently checkable sub-histories.

        Linearizability is compositional (Herlihy & Wing): a history of
        independent objects is linearizable iff each object's sub-history is,
        which turns one exponential search into several small ones.
        """
        ...

    def describe_operation(self, op: Operation) -> str:
        """Human-readable form for failure reports."""
        ...


def partition_by_key(history: Sequence[Operation]) -> list[list[Operation]]:
    """Group operations by ``Operation.key``, keeping first-seen key order for stable reports."""
    groups: dict[Hashable, list[Operation]] = {}
    for op in history:
        groups.setdefault(op.key, []).append(op)
    return list(groups.values())


def _show(value: Any) -> str:
    if value is UNKNOWN:
        return "?"
    if value is None:
        return "nil"
    return repr(value)


@dataclass(frozen=True)
class RegisterModel:
    """A single read/write/compare-and-set register, as in Jepsen's etcd test.

    Operations with different ``key`` are treated as different registers
    (Jepsen's ``independent`` tests), so histories are partitioned by key.
    """

    initial: Hashable = None

    def init(self) -> Hashable:
        return self.initial

    def step(self, state: Hashable, input: Any, output: Any) -> tuple[bool, Hashable]:
        f = input["f"]
        if f == "read":
            return (output is UNKNOWN or output == state), state
        if f == "write":
            return True, input["value"]
        if f == "cas":
            swapped = state == input["from"]
            new_state = input["to"] if swapped else state
            return (output is UNKNOWN or output == swapped), new_state
        raise ValueError(f"register model: unknown operation {f!r}")

    def partition(self, history: Sequence[Operation]) -> list[list[Operation]]:
        return partition_by_key(history)

    def describe_operation(self, op: Operation) -> str:
        f = op.input["f"]
        prefix = "" if op.key is None else f"[{op.key!r}] "
        if f == "read":
            text = f"read() -> {_show(op.output)}"
        elif f == "write":
            text = f"write({_show(op.input['value'])})"
        elif f == "cas":
            result = {True: "ok", False: "not equal"}.get(op.output, _show(op.output))
            text = f"cas({_show(op.input['from'])} -> {_show(op.input['to'])}) -> {result}"
        else:
            text = repr(op.input)
        return f"{prefix}{text}"


# Key-value state: a frozen map encoded as a sorted tuple of (key, value) pairs.
# After partitioning by key it holds at most one pair, so lookups stay trivial.
KvState = tuple[tuple[Hashable, str], ...]


@dataclass(frozen=True)
class KeyValueModel:
    """Independent string registers with get / put / append, initially "".

    ``partitioned=False`` checks the whole history as one object; it exists to
    confirm that partitioning does not change verdicts, not for speed.
    """

    partitioned: bool = True

    def init(self) -> KvState:
        return ()

    def step(self, state: KvState, input: Any, output: Any) -> tuple[bool, KvState]:
        f = input["f"]
        key = input["key"]
        current = ""
        for k, v in state:
            if k == key:
                current = v
                break
        if f == "get":
            return (output is UNKNOWN or output == current), state
        if f == "put":
            return True, _assign(state, key, input["value"])
        if f == "append":
            return True, _assign(state, key, current + input["value"])
        raise ValueError(f"key-value model: unknown operation {f!r}")

    def partition(self, history: Sequence[Operation]) -> list[list[Operation]]:
        if self.partitioned:
            return partition_by_key(history)
        return [list(history)]

    def describe_operation(self, op: Operation) -> str:
        f = op.input["f"]
        key = op.input["key"]
        if f == "get":
            return f"get({key!r}) -> {_show(op.output)}"
        return f"{f}({key!r}, {_show(op.input['value'])})"


def _assign(state: KvState, key: Hashable, value: str) -> KvState:
    if not state or (len(state) == 1 and state[0][0] == key):
        return ((key, value),)  # the only shape a partitioned history ever sees
    items = dict(state)
    items[key] = value
    return tuple(sorted(items.items(), key=lambda item: repr(item[0])))

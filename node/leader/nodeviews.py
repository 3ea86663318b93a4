"""The leader's live view of every node, keeping what its readers ask about as views are written.

The lifecycle keeps one ``NodeView`` per node, current from the change
journal; the heartbeat monitor and the drainer read it. Both used to scan
every view on each wake, and at Protean's scale (30,000 nodes) each scan
cost the leader some 6-7% of its CPU (issue #36). So this mapping keeps, as
each view is written, what those scans looked for:

- ``draining``: the nodes whose view drains. The drainer wakes at least
  every second and only asks whether any node drains;
- the nodes whose view was added, changed status or went away
  (``take_changed``): the heartbeat monitor settles the deadlines of those
  alone on its next pass, instead of looking at every node.

Views are frozen, so a change can only come through the mapping's writes,
and none is missed.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, MutableMapping, ValuesView
from collections.abc import Set as AbstractSet
from typing import Any

from node.leader.shims import NodeView

_MISSING: Any = object()


class NodeViews(MutableMapping[str, NodeView]):
    """Node id -> its view, as a dict; writes also keep the draining nodes and the changed ones."""

    __slots__ = ("_views", "_draining", "_changed")

    def __init__(self, views: Mapping[str, NodeView] | None = None) -> None:
        self._views: dict[str, NodeView] = {}
        self._draining: set[str] = set()
        self._changed: set[str] = set()  # added, status changed or removed since the last take_changed
        if views:
            self.update(views)

    @classmethod
    def of(cls, views: Mapping[str, NodeView]) -> NodeViews:
        """``views`` itself if it keeps what its readers need; else a copy that does (tests hand plain dicts).

        Writes to the plain mapping after the copy are not seen: write
        through the copy (the service's ``nodes``).
        """
        return views if isinstance(views, NodeViews) else cls(views)

    # -- what the scans looked for ----------------------------------------------------------------
    @property
    def draining(self) -> AbstractSet[str]:
        """Ids of the nodes whose view drains (read-only: it changes as views are written)."""
        return self._draining

    def take_changed(self) -> set[str]:
        """Ids of the nodes added, whose status changed, or removed since the last call; then none.

        One reader takes them (the heartbeat monitor): a second would see
        only what the first left.
        """
        changed, self._changed = self._changed, set()
        return changed

    # -- reads, at a dict's speed (the lifecycle reads a view per alloc record) --------------------
    def __getitem__(self, node_id: str) -> NodeView:
        return self._views[node_id]

    def get(self, node_id: str, default: Any = None) -> Any:
        return self._views.get(node_id, default)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._views

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def keys(self) -> KeysView[str]:
        return self._views.keys()

    def values(self) -> ValuesView[NodeView]:
        return self._views.values()

    def items(self) -> ItemsView[str, NodeView]:
        return self._views.items()

    def __repr__(self) -> str:
        return f"NodeViews({self._views!r})"

    # -- writes: every one goes through these -------------------------------------------------------
    def __setitem__(self, node_id: str, view: NodeView) -> None:
        before = self._views.get(node_id)
        self._views[node_id] = view
        if view.drain:
            self._draining.add(node_id)
        else:
            self._draining.discard(node_id)
        if before is None or before.status != view.status:
            self._changed.add(node_id)

    def __delitem__(self, node_id: str) -> None:
        del self._views[node_id]
        self._draining.discard(node_id)
        self._changed.add(node_id)

    def pop(self, node_id: str, default: Any = _MISSING) -> Any:
        """Remove ``node_id``'s view and return it (``default`` if it has none; KeyError without one)."""
        if node_id in self._views:
            view = self._views[node_id]
            del self[node_id]
            return view
        if default is _MISSING:
            raise KeyError(node_id)
        return default

    def clear(self) -> None:
        """Remove every view (a rebuild); each node counts as changed."""
        self._changed.update(self._views)
        self._views.clear()
        self._draining.clear()

"""List pages: Nomad's ``per_page`` / ``next_token`` / ``filter`` / ``reverse``, bounded by construction.

A list RPC never answers with a whole table: at 20,000 allocations one
answer was 11.8 MB against the 4 MiB frame limit. Every list reads its rows
in key order straight from LMDB (``StateReader.scan_range``) and stops when
the page is full, which happens at the first of:

* ``per_page`` matches (capped at ``MAX_PER_PAGE`` whatever the caller asks);
* a byte budget of encoded items (``page_budget``: a quarter of the frame
  limit, at most 1 MiB), so no page can come near the frame limit;
* ``SCAN_LIMIT`` rows read, so a filter that matches little still answers
  quickly (with fewer items, maybe none, and a token to go on).

As in Nomad, ``next_token`` is where the next page starts: the ID of its
first item (for lists read through an index, that row's key within the
index). The filter runs on the server before paging, so rows it rejects do
not count toward ``per_page``; an empty token means the list is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fsm import codec
from fsm.keys import SEP, last_part
from fsm.store import STRUCT_OF, StateReader
from node.core.filter import Filter, FilterError, compile_filter
from node.wire.errors import BAD_REQUEST, RPCError

MAX_PER_PAGE = 5000
MAX_PAGE_BYTES = 1 << 20
SCAN_LIMIT = 20_000
MAX_TOKEN_BYTES = 512  # LMDB keys are at most 511 bytes: a longer token names no row

# A row of a list: (the token that starts a page at it, a thunk giving its object or None).
Row = tuple[str, Callable[[], Any]]


@dataclass(frozen=True)
class PageRequest:
    """What a caller asked of one list page (validated)."""

    per_page: int = 0  # 0: as many as the page's budgets allow
    next_token: str = ""
    filter: Filter | None = None
    reverse: bool = False
    prefix: str = ""


@dataclass
class Page:
    """One page of a list: its items in Nomad's shape, and where the next page starts ("" at the end)."""

    items: list[dict[str, Any]] = field(default_factory=list)
    next_token: str = ""


def page_budget(max_frame: int) -> int:
    """Bytes of encoded items one page may carry: well under the frame limit whatever it is set to."""
    return max(1, min(MAX_PAGE_BYTES, max_frame // 4))


def _bad(message: str) -> RPCError:
    return RPCError(BAD_REQUEST, message)


def page_request(args: dict[str, Any]) -> PageRequest:
    """The paging arguments of a list RPC; a 400 (``bad_request``) for any that is malformed."""
    per_page = args.get("per_page", 0)
    if per_page is None:
        per_page = 0
    if not isinstance(per_page, int) or isinstance(per_page, bool) or per_page < 0:
        raise _bad("argument 'per_page' must be a whole number >= 0 (0: the server's page size)")
    values = {name: args.get(name) or "" for name in ("next_token", "filter", "prefix")}
    for name, value in values.items():
        if not isinstance(value, str):
            raise _bad(f"argument {name!r} must be a string")
    if len(values["next_token"].encode()) > MAX_TOKEN_BYTES:
        raise _bad(f"argument 'next_token' is longer than {MAX_TOKEN_BYTES} bytes; pass the token a list answered")
    reverse = args.get("reverse", False)
    if not isinstance(reverse, bool):
        raise _bad("argument 'reverse' must be a bool")
    try:
        compiled = compile_filter(values["filter"]) if values["filter"] else None
    except FilterError as exc:
        raise _bad(str(exc)) from None
    return PageRequest(per_page, values["next_token"], compiled, reverse, values["prefix"])


# -- rows ----------------------------------------------------------------------------------
def table_rows(reader: StateReader, table: str, req: PageRequest) -> Iterator[Row]:
    """The rows of ``table`` whose id starts with the request's prefix; a row's token is its id."""
    cls = STRUCT_OF[table]
    rows = reader.scan_range(table, req.prefix.encode(), req.next_token.encode(), req.reverse)
    for k, v in rows:
        yield k.decode(), lambda v=v: codec.load(cls, v)


def index_rows(reader: StateReader, index: str, owner: str, get: Callable[[str], Any], req: PageRequest) -> Iterator[Row]:
    """The objects an index lists under ``owner`` (a job's allocs, a node's), in the index's key order.

    A row's token is its key after the owner's part, with NUL written as
    "." (ids never hold NUL, and the tails here are flags and UUIDs), so it
    travels in a header.
    """
    start = owner.encode() + SEP
    origin = start + req.next_token.replace(".", "\x00").encode() if req.next_token else b""
    for k, _ in reader.scan_range(index, start, origin, req.reverse):
        yield k[len(start):].decode().replace("\x00", "."), lambda k=k: get(last_part(k))


# -- pages ---------------------------------------------------------------------------------
def collect(rows: Iterator[Row], req: PageRequest, view: Callable[[Any], dict[str, Any]], budget: int) -> Page:
    """Fill one page from ``rows``: the filter first, then ``per_page``, the byte budget and the scan limit.

    Once the page is full the scan goes on (within the scan limit) to the
    next row the filter keeps, so its token starts the next page and a list
    whose last match was on this page says it is done, as Nomad's paginator does.
    """
    limit = min(req.per_page or MAX_PER_PAGE, MAX_PER_PAGE)
    page = Page()
    size = scanned = 0
    for token, load in rows:
        if scanned >= SCAN_LIMIT:
            page.next_token = token
            return page
        scanned += 1
        item = _matching(load(), req, view)
        if item is None:
            continue
        if len(page.items) >= limit:
            page.next_token = token
            return page
        n = len(codec.pack(item))
        if page.items and size + n > budget:
            page.next_token = token
            return page
        page.items.append(item)
        size += n
    return page


def _matching(obj: Any, req: PageRequest, view: Callable[[Any], dict[str, Any]]) -> dict[str, Any] | None:
    """``obj`` in its list shape if it exists and passes the filter, else None."""
    if obj is None:  # an index row whose object went between the two reads of one transaction: never, but cheap
        return None
    item = view(obj)
    if req.filter is None:
        return item
    try:
        return item if req.filter.matches(item) else None
    except FilterError as exc:
        raise _bad(f"filter {req.filter.text!r}: {exc}") from None

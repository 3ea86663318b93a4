"""Lists in the CLI: every page of a list RPC, printed as it arrives.

A list RPC answers one bounded page and a ``next_token`` (``node.core.paging``),
so ``caravan alloc list`` works at any size: it asks for the next page until
the token is empty and prints each page as it comes, holding no more than
one page. The table's columns are sized by the first page (later rows keep
those widths); ``--json`` streams one JSON array, the same text as printing
the whole list at once. As Nomad's CLI: ``--per-page N`` prints one page of
N and says how to ask for the next (``--page-token``); ``--filter`` is
Nomad's filter expression, applied by the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import click
from tabulate import MIN_PADDING, tabulate

from node.cli.common import Ctx, cell

Columns = list[tuple[str, str]]
Row = Callable[[dict[str, Any]], dict[str, Any]]


def list_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--filter, --per-page and --page-token, as Nomad's list commands take them."""
    fn = click.option("--page-token", default=None, help="Start at this token (printed after a --per-page page).")(fn)
    fn = click.option(
        "--per-page", type=click.IntRange(min=1), default=None,
        help="Print one page of this many items and the token of the next (default: every item, paged).",
    )(fn)
    fn = click.option(
        "--filter", "filter_expr", default=None,
        help='Filter expression, as Nomad\'s (e.g. \'ClientStatus == "running"\'), applied by the server.',
    )(fn)
    return fn


def pages(
    c: Ctx, method: str, args: dict[str, Any], *, filter_expr: str | None = None,
    per_page: int | None = None, page_token: str | None = None,
) -> Iterator[tuple[list[dict[str, Any]], str]]:
    """(items, next_token) of each page of ``method``; one page only when ``per_page`` is given."""
    call = dict(args)
    if filter_expr:
        call["filter"] = filter_expr
    if per_page:
        call["per_page"] = per_page
    token = page_token or ""
    out = c.read_answer(method, {**call, "next_token": token} if token else call)
    while True:
        token = out.get("next_token") or ""
        yield out["data"], token
        if not token or per_page:
            return
        out = c.call(method, {**call, "next_token": token})


def every_item(c: Ctx, method: str, args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every item of a list, page after page (for commands that show a list inside other output)."""
    for items, _ in pages(c, method, args):
        yield from items


def emit_list(
    c: Ctx, method: str, args: dict[str, Any], columns: Columns, row: Row = dict, *,
    filter_expr: str | None = None, per_page: int | None = None, page_token: str | None = None,
    json_row: Row | None = None,
) -> None:
    """Print a list as its pages arrive: a table (``row`` shapes an item for it), or JSON under --json
    (``json_row`` shapes an item for it, for lists whose RPC rows are not yet in their JSON names)."""
    out = _JSONArray() if c.as_json else _Table(columns, row)
    after = ""
    for items, next_token in pages(c, method, args, filter_expr=filter_expr, per_page=per_page, page_token=page_token):
        out.add([json_row(i) for i in items] if c.as_json and json_row else items)
        after = next_token
    out.close()
    if per_page and after:
        click.echo(f"Results have been paginated. To get the next page, add: --page-token {after}", err=True)


class _JSONArray:
    """A JSON array written an item at a time, the same text as ``json.dumps(items, indent=2, sort_keys=True)``."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            body = json.dumps(item, indent=2, sort_keys=True).replace("\n", "\n  ")
            click.echo(("[\n  " if self.count == 0 else ",\n  ") + body, nl=False)
            self.count += 1

    def close(self) -> None:
        click.echo("\n]" if self.count else "[]")


class _Table:
    """A plain table printed page by page; the first page with rows sets the column widths."""

    def __init__(self, columns: Columns, row: Row) -> None:
        self.columns = columns
        self.row = row
        self.widths: list[int] = []
        self.numeric: list[bool] = []

    def add(self, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        body = [[cell(self.row(item).get(key)) for _, key in self.columns] for item in items]
        if not self.widths:
            headers = [h for h, _ in self.columns]
            self.widths = [max(len(h) + MIN_PADDING, *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
            self.numeric = [all(_is_number(r[i]) for r in body) for i in range(len(headers))]
            click.echo(tabulate(body, headers=headers, tablefmt="plain"))
            return
        for r in body:
            cells = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(r, self.widths, self.numeric, strict=True)]
            click.echo("  ".join(cells))

    def close(self) -> None:
        if not self.widths:
            click.echo("No results")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


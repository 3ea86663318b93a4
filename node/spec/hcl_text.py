"""HCL text read with python-hcl2: its dict, every block's and attribute's line, and one-line syntax errors.

python-hcl2's dict forgets where things were, and its syntax errors are
multi-line parser dumps. This module keeps the raw parse tree long enough to
record the line of each block and attribute (so warnings and type errors in
``node.spec.hcl_values`` can name the line) and turns parser errors into an
``HCLError`` with line and column. It knows nothing of Nomad's blocks.
"""

from __future__ import annotations

from typing import Any

from node.spec.errors import HCLError

BLOCK_MARK = "__is_block__"

# A block's place in the file: ((block type, nth of that type in its body), ...) from the top.
Path = tuple[tuple[str, int], ...]
BlockLines = dict[Path, int]
AttrLines = dict[tuple[Path, str], int]


def _positions(tree: Any) -> tuple[BlockLines, AttrLines]:
    """Line of every block (by path of (type, nth of that type)) and attribute.

    Also refuses an attribute set twice in one body, which python-hcl2
    silently resolves to the last value (HCL says it is an error).
    """
    blocks: BlockLines = {}
    attrs: AttrLines = {}

    def walk(body: Any, path: Path) -> None:
        seen: dict[str, int] = {}
        for child in getattr(body, "children", ()):
            kind = getattr(child, "data", None)
            if kind == "block":
                name, line = _ident(child.children[0])
                n = seen.get(name, 0)
                seen[name] = n + 1
                blocks[path + ((name, n),)] = line
                inner = next(
                    (c for c in child.children if getattr(c, "data", None) == "body"), None
                )
                if inner is not None:
                    walk(inner, path + ((name, n),))
            elif kind == "attribute":
                name, line = _ident(child.children[0])
                if (path, name) in attrs:
                    raise HCLError(
                        f"line {line}: attribute {name!r} is set twice in the same block (first at line {attrs[(path, name)]})"
                    )
                attrs[(path, name)] = line

    root = tree.children[0] if getattr(tree, "data", None) == "start" and tree.children else tree
    walk(root, ())
    return blocks, attrs


def _ident(node: Any) -> tuple[str, int]:
    """A block type's or attribute's name and line, from its identifier node."""
    token = node.children[0] if getattr(node, "children", None) else node
    return str(token), int(getattr(token, "line", 0) or 0)


def _syntax_error(exc: Exception, source: str) -> HCLError:
    """The parser's error as one line an operator can act on: where, and what was unexpected."""
    line = getattr(exc, "line", None)
    column = getattr(exc, "column", None)
    token = getattr(exc, "token", None)
    char = getattr(exc, "char", None)
    if token is not None and getattr(token, "type", "") == "$END":
        what = "unexpected end of file (an unclosed block, string or list?)"
    elif token is not None and not str(token).strip():
        what = "unexpected end of line (a value or a closing bracket is missing)"
    elif token is not None:
        what = f"unexpected {str(token)!r}"
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "accepts", None) or [])
        if expected and len(expected) <= 6:
            what += f" (expected {', '.join(e.lower() for e in expected)})"
    elif char is not None:
        what = f"unexpected character {char!r}"
    else:
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = f"{source}:" if source else ""
    if isinstance(line, int) and line > 0:
        return HCLError(
            f"{where}{line}:{column}: invalid HCL at line {line}, column {column}: {what}"
        )
    return HCLError(f"{where} invalid HCL: {what}".strip())


def load_hcl(text: str, source: str = "") -> tuple[dict[str, Any], BlockLines, AttrLines]:
    """(python-hcl2's dict, block lines, attribute lines); raises HCLError with line and column."""
    import hcl2  # imported here: the CLI imports this module for JSON specs too
    from lark.exceptions import LarkError, UnexpectedInput

    try:
        tree = hcl2.parses_to_tree(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, source) from None
    except LarkError as exc:
        raise HCLError(
            f"{source + ': ' if source else ''}invalid HCL: {str(exc).splitlines()[0]}"
        ) from None
    blocks, attrs = _positions(tree)
    options = hcl2.SerializationOptions(
        with_comments=False,
        with_meta=False,
        explicit_blocks=True,
        strip_string_quotes=True,
        preserve_heredocs=False,
    )
    try:
        data = hcl2.serialize(
            hcl2.transform(tree, discard_comments=True), serialization_options=options
        )
    except Exception as exc:  # noqa: BLE001 - the library's own errors have no common base
        raise HCLError(f"{source + ': ' if source else ''}invalid HCL: {exc}") from None
    return data, blocks, attrs


def _is_block_body(value: Any) -> bool:
    """Whether ``value`` is a block's body (python-hcl2 marks them with ``explicit_blocks``)."""
    return isinstance(value, dict) and value.get(BLOCK_MARK) is True


def block_list(value: Any) -> list[tuple[list[str], dict[str, Any]]] | None:
    """[(labels, body)] if ``value`` is python-hcl2's list of blocks, else None."""
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None
    out = []
    for item in value:
        labels: list[str] = []
        body = item
        while not _is_block_body(body):
            if not isinstance(body, dict) or len(body) != 1:
                return None
            ((label, inner),) = body.items()
            labels.append(label)
            body = inner
        out.append((labels, body))
    return out



"""Logging of a server process: structlog over the stdlib, one file per node.

The log file gets JSON lines (machines read it: jepsen_like, log shippers);
a terminal gets structlog's console renderer. Both go through the stdlib
``logging`` machinery so that pysyncobj's own stdlib log records land in the
same file, with the same ``node_id`` and the same redaction.

Secrets must never reach a log: the redactor runs last, after tracebacks
are formatted, on every line. It blanks values under secret-looking keys
(``secret_id``, ``token``, ``raft_password``, ...) anywhere in the event,
nested maps, lists and dataclasses included, and scrubs known secret values
(the raft password) out of every string, tracebacks included. Exceptions are
rendered as plain text tracebacks, never with local variables.

``configure_logging`` sets this up for the whole process (one process is one
server). ``build_logger`` builds the same pipeline as a private logger that
touches no global state, for tests and for running several nodes in one
process.
"""

from __future__ import annotations

import dataclasses
import logging
import logging.handlers
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import structlog
from structlog.typing import EventDict, Processor

from fsm.record import Record
from fsm.record import fields as record_fields

if TYPE_CHECKING:
    from node.core.config import ServerConfig

REDACTED = "<redacted>"
# Keys are compared lowercased with separators removed, so "secretID",
# "Secret-ID" and "secret_id" all match.
SECRET_KEYS = frozenset(
    {"secret", "secretid", "token", "password", "raftpassword", "passwd", "authorization"}
)
SECRET_SUFFIXES = ("secret", "secretid", "token", "password", "passwd")
MIN_SECRET_VALUE_LENGTH = 6  # shorter "secrets" would blank ordinary words
_MAX_DEPTH = 32
_SEPARATORS = re.compile(r"[^a-z0-9]")


def is_secret_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    norm = _SEPARATORS.sub("", key.lower())
    return norm in SECRET_KEYS or norm.endswith(SECRET_SUFFIXES)


class SecretRedactor:
    """structlog processor that removes secrets from an event dict.

    ``secret_values`` are literal strings (the raft password) scrubbed from
    every string anywhere in the event; they cover what key-based redaction
    cannot, like an exception message quoting a config value.
    """

    def __init__(self, secret_values: Iterable[str] = ()) -> None:
        values = sorted(
            {v for v in secret_values if v and len(v) >= MIN_SECRET_VALUE_LENGTH},
            key=len,
            reverse=True,
        )
        self._pattern = re.compile("|".join(re.escape(v) for v in values)) if values else None

    def __call__(self, logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
        return {
            key: value
            if key == "_record"
            else self._clean(key, value, 0)  # the stdlib record itself is not rendered
            for key, value in event_dict.items()
        }

    def _clean(self, key: Any, value: Any, depth: int) -> Any:
        if is_secret_key(key) and value is not None:
            return REDACTED
        if depth > _MAX_DEPTH:
            return "<too deep>"
        if isinstance(value, str):
            return self._pattern.sub(REDACTED, value) if self._pattern else value
        if isinstance(value, dict):
            return {k: self._clean(k, v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self._clean(None, v, depth + 1) for v in value]
        if isinstance(value, Record) or dataclasses.is_dataclass(value) and not isinstance(value, type):
            # A record's repr would print every field, secrets included.
            names = record_fields(type(value)) if isinstance(value, Record) else dataclasses.fields(value)
            fields = {f.name: getattr(value, f.name) for f in names}
            return {
                "_type": type(value).__name__,
                **{k: self._clean(k, v, depth + 1) for k, v in fields.items()},
            }
        if isinstance(value, int | float | bool | bytes) or value is None:
            return value
        # Anything else is rendered through repr/str: scrub that text.
        return self._clean(key, repr(value), depth + 1) if self._pattern else value


@dataclass(frozen=True)
class LogSettings:
    """Where and how one node logs.

    ``console`` None means: on if stderr is a terminal or there is no log
    file (so a daemon writing to its file does not print everything twice).
    """

    node_id: str
    level: str = "info"
    log_file: Path | None = None
    console: bool | None = None
    stream: TextIO | None = None  # default: sys.stderr at setup time
    secret_values: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_config(cls, config: ServerConfig, **overrides: Any) -> LogSettings:
        """From a ``node.config.ServerConfig``; the raft password becomes a scrubbed value."""
        settings = cls(
            node_id=config.node_id,
            level=config.log_level,
            log_file=config.log_file,
            secret_values=(config.raft_password,),
        )
        return dataclasses.replace(settings, **overrides)


@dataclass
class LogHandle:
    """What a setup installed, so it can be taken down again (tests, shutdown)."""

    logger: logging.Logger
    handlers: list[logging.Handler]
    global_config: bool
    previous_level: int | None = None

    def close(self) -> None:
        for handler in self.handlers:
            self.logger.removeHandler(handler)
            handler.close()
        self.handlers.clear()
        if self.global_config:
            structlog.reset_defaults()
            if self.previous_level is not None:
                self.logger.setLevel(self.previous_level)


def _level(name: str) -> int:
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {name!r}; use debug, info, warning or error")
    return level


def _shared_processors(settings: LogSettings) -> list[Processor]:
    node_id = settings.node_id

    def add_node_id(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("node_id", node_id)
        return event_dict

    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_node_id,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,  # text tracebacks, before redaction
        SecretRedactor(settings.secret_values),
    ]


def _handlers(settings: LogSettings, shared: list[Processor]) -> list[logging.Handler]:
    def formatter(renderer: Processor) -> logging.Formatter:
        return structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared,
        )

    handlers: list[logging.Handler] = []
    if settings.log_file is not None:
        path = Path(settings.log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Watched: logrotate may move the file away; we reopen it.
        file_handler = logging.handlers.WatchedFileHandler(path, encoding="utf-8")
        file_handler.setFormatter(formatter(structlog.processors.JSONRenderer()))
        handlers.append(file_handler)
    stream = settings.stream if settings.stream is not None else sys.stderr
    is_tty = hasattr(stream, "isatty") and stream.isatty()
    console = (
        settings.console if settings.console is not None else (is_tty or settings.log_file is None)
    )
    if console:
        renderer: Processor = (
            structlog.dev.ConsoleRenderer(
                colors=True, exception_formatter=structlog.dev.plain_traceback
            )
            if is_tty
            else structlog.processors.JSONRenderer()
        )
        console_handler = logging.StreamHandler(stream)
        console_handler.setFormatter(formatter(renderer))
        handlers.append(console_handler)
    return handlers


def configure_logging(settings: LogSettings | ServerConfig, **overrides: Any) -> LogHandle:
    """Set up logging for this process from a ``LogSettings`` or a ``ServerConfig``.

    Replaces handlers that an earlier call installed; other root handlers
    (pytest's capture, for one) are left alone.
    """
    if not isinstance(settings, LogSettings):
        settings = LogSettings.from_config(settings, **overrides)
    elif overrides:
        settings = dataclasses.replace(settings, **overrides)
    shared = _shared_processors(settings)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "caravan_owned", False):
            root.removeHandler(handler)
            handler.close()
    handlers = _handlers(settings, shared)
    for handler in handlers:
        handler.caravan_owned = True  # type: ignore[attr-defined]  # ours to replace on reconfigure
        root.addHandler(handler)
    previous_level = root.level
    root.setLevel(_level(settings.level))
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # reconfigurable (tests); lookups are cheap
    )
    return LogHandle(root, handlers, global_config=True, previous_level=previous_level)


def build_logger(settings: LogSettings, name: str = "caravan") -> tuple[Any, LogHandle]:
    """The same pipeline as ``configure_logging`` on a private logger; no global state.

    Returns a structlog logger to pass around explicitly, and the handle
    that closes its files.
    """
    shared = _shared_processors(settings)
    stdlib_logger = logging.Logger(name, _level(settings.level))  # not registered: private
    stdlib_logger.propagate = False
    handlers = _handlers(settings, shared)
    for handler in handlers:
        stdlib_logger.addHandler(handler)
    log = structlog.wrap_logger(
        stdlib_logger,
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
    )
    return log, LogHandle(stdlib_logger, handlers, global_config=False)

"""The two ways a jobspec is refused, in one place both readers and the checks share.

An operator sees these messages verbatim (CLI, ``/v1/jobs``, ``/v1/jobs/parse``),
so each is one line naming the field, or the line of the HCL file, and what to
change. They are ``ValueError`` subclasses so a caller that only wants "bad
input" can catch that.
"""

from __future__ import annotations


class JobSpecError(ValueError):
    """An invalid jobspec; the message names the field and what to change."""


class HCLError(ValueError):
    """An unusable HCL jobspec; the message is one line with the position."""

"""The library's published configuration schema and stats fields, and its config check.

These are the one source of truth for configuration keys and counter names: the
Python side derives its key lists and metric help texts from them instead of copying.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from . import _native
from .tier import _check, _config_text


@functools.cache
def config_schema() -> dict:
    """``kvt_config_schema()`` parsed: ``{"version", "store_types", "keys": [...]}``."""
    return json.loads(_native.load().kvt_config_schema().decode())


@functools.cache
def stats_fields() -> tuple[tuple[str, str], ...]:
    """``(name, help)`` of every ``kvt_stats`` counter, in the library's field order."""
    return tuple((f["name"], f["help"]) for f in json.loads(_native.load().kvt_stats_fields().decode()))


def check_config(config: Mapping[str, Any] | str) -> None:
    """Validates a configuration exactly as tier creation would, without opening the
    store; raises :class:`~kvtier.ConfigError` (the library's message) if it is bad."""
    _check(_native.load().kvt_config_check(_config_text(config).encode()))

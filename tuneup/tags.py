"""A run's tags: project, user, experiment, anything a team groups its runs by (`TuneupCallback(tags=...)`,
`TUNEUP_TAGS=project=vision,user=ana`). Kept in the manifest; the fleet index and dashboard group by them.

One reading for both spellings, checked when the recorder is built (before any training starts), so that a
tag the index could not group by never reaches a record. Pure: no torch, no trainer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

TAGS_ENV = "TUNEUP_TAGS"
MAX_TAGS = 32
MAX_VALUE_CHARS = 256
# A key is a column name in SQL and a label in a page: letters, digits, `_`, `.`, `-`, starting with a letter
# or `_`.
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


class TagError(ValueError):
    """Tags that cannot be recorded; the message names the tag and the form that works."""


def parse_tags(text: str) -> dict[str, str]:
    """`project=vision,user=ana` as a dict; a value keeps any `=` after the first. Raises TagError."""
    tags: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise TagError(f"tag {item.strip()!r} has no value: write key=value, several separated by commas")
        tags[key.strip()] = value.strip()
    return checked_tags(tags)


def checked_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    """The tags as strings (a number or a bool is written as text); raises TagError naming a bad one."""
    if not isinstance(tags, Mapping):
        raise TagError(
            f"tags must be a mapping of names to values, like {{'project': 'vision'}}, got {tags!r}"
        )
    if len(tags) > MAX_TAGS:
        raise TagError(f"{len(tags)} tags: at most {MAX_TAGS}")
    out: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise TagError(
                f"tag name {key!r}: use letters, digits, '_', '.' or '-' (64 at most), starting with a letter"
            )
        if isinstance(value, str | bool | int | float):
            text = str(value)
        else:
            raise TagError(f"tag {key}: the value must be text or a number, got {type(value).__name__}")
        if len(text) > MAX_VALUE_CHARS or any(ord(ch) < 32 for ch in text):
            raise TagError(f"tag {key}: the value must be one line of at most {MAX_VALUE_CHARS} characters")
        out[key] = text
    return out


def run_tags(given: Mapping[str, Any] | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The run's tags: `TUNEUP_TAGS`'s, with the ones given in code over them. Raises TagError, naming which."""
    try:
        from_env = parse_tags(environ.get(TAGS_ENV, ""))
    except TagError as exc:
        raise TagError(f"{TAGS_ENV}: {exc}") from None
    return {**from_env, **checked_tags(given or {})}


def recorded_tags(raw: Any) -> dict[str, str]:
    """The tags a manifest holds, as strings; whatever is not a tag (an edited manifest) is left out."""
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}

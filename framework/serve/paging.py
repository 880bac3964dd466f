"""OpenAI's list pages (``GET /v1/files``, ``GET /v1/batches``): ``limit`` objects after
the one ``after`` names, with ``first_id``, ``last_id`` and ``has_more``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import RequestError

__all__ = ["page", "query_limit"]


def query_limit(query: Mapping[str, str], default: int, most: int) -> int:
    """The ``limit`` query parameter: an integer from 1 to ``most`` (``default`` when
    absent); a 400 naming it otherwise."""
    given = query.get("limit")
    if given is None:
        return default
    if not given.strip().isdigit() or not 1 <= int(given) <= most:
        raise RequestError(
            f"limit must be an integer from 1 to {most}, got {given[:40]!r}", param="limit"
        )
    return int(given)


def page(entries: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """A list page of ``entries`` (already in the list's order): those after the id
    ``after`` (a 400 naming it when no entry has it), at most ``limit``."""
    if after is not None:
        ids = [entry["id"] for entry in entries]
        if after not in ids:
            raise RequestError(
                f"after must be the id of an object in this list, got {after[:80]!r}",
                param="after",
            )
        entries = entries[ids.index(after) + 1 :]
    data = entries[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(entries) > limit,
    }

"""`POST /sessions/search`: the SDK's session search, over the calling key's own sessions.

Each API key owns its sessions (there are no organisations or projects), so the owners a search
may name collapse to the caller: `own` and `accessible` both mean the key's sessions, and
`project_ids` or named owner URNs are refused with a clear error rather than silently ignored.
Filters, newest-first order and the cursor follow `tinker.types.SessionSearchRequest`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from server.engine.engine import UserError


class SearchError(UserError):
    """A search this server cannot answer (projects, other owners, a bad cursor)."""


class SessionLike(Protocol):
    session_id: str
    owner: str
    created: str
    finished: str | None
    user_metadata: dict[str, Any]


def _status(session: SessionLike) -> dict[str, Any]:
    if session.finished is None:
        return {"type": "active"}
    return {"type": "client_finished", "reason": {"type": session.finished}}


def _matches_status(session: SessionLike, queries: list[dict[str, Any]] | None) -> bool:
    if not queries:
        return True
    for query in queries:
        kind = query.get("type")
        if kind == "active" and session.finished is None:
            return True
        if kind == "client_finished" and session.finished is not None:
            reasons = query.get("reasons")
            if not reasons or session.finished in reasons:
                return True
    return False  # "cancelled" and "failed" sessions are not kept apart here


def _display_name(session: SessionLike) -> str | None:
    return getattr(session, "display_name", None)


def _matches_text(session: SessionLike, session_id: str | None, name: str | None) -> bool:
    if session_id is None and name is None:
        return True
    if session_id is not None and session.session_id == session_id:
        return True
    if name is not None:
        display = (_display_name(session) or "").lower()
        return bool(display) and all(word in display for word in name.lower().split())
    return False


def search(
    sessions: Iterable[SessionLike],
    owner: str,
    body: dict[str, Any],
    checkpoints_of: Callable[[SessionLike], int],
) -> dict[str, Any]:
    body = {key: value for key, value in body.items() if value is not None}  # null: not given
    for key, kind in (("owner", dict), ("user_metadata", dict), ("statuses", list),
                      ("cursor", dict)):
        if key in body and not isinstance(body[key], kind):
            raise SearchError(f"{key} must be {'an object' if kind is dict else 'a list'}")
    if any(not isinstance(query, dict) for query in body.get("statuses", [])):
        raise SearchError("statuses must be a list of objects with a 'type'")
    owner_filter = body.get("owner", {"type": "own"}).get("type", "own")
    if owner_filter == "user":
        raise SearchError("sessions belong to API keys here; searching other owners is not "
                          "possible (use owner 'own')")
    if body.get("project_ids"):
        raise SearchError("projects are not modelled by this server; omit project_ids")
    limit = body.get("limit", 50)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 200:
        raise SearchError("limit must be between 1 and 200")
    wanted_meta = {str(k): str(v) for k, v in (body.get("user_metadata") or {}).items()}
    found = [
        s for s in sessions
        if s.owner == owner
        and _matches_text(s, body.get("session_id"), body.get("display_name"))
        and all(str(s.user_metadata.get(k)) == v for k, v in wanted_meta.items())
        and _matches_status(s, body.get("statuses"))
    ]
    found.sort(key=lambda s: (s.created, s.session_id), reverse=True)
    cursor = body.get("cursor")
    if cursor:
        try:
            created = dt.datetime.fromisoformat(cursor["last_created_at"])
            after = (created, cursor["last_session_id"])
        except (KeyError, TypeError, ValueError):
            raise SearchError("malformed cursor; pass next_cursor back unchanged") from None
        found = [s for s in found if (dt.datetime.fromisoformat(s.created), s.session_id) < after]
    page = found[:limit]
    next_cursor = None
    if len(found) > limit:
        last = page[-1]
        next_cursor = {"last_created_at": last.created, "last_session_id": last.session_id}
    return {
        "sessions": [
            {
                "session_id": s.session_id,
                "created_at": s.created,
                "owner": s.owner,
                "project_id": "default",
                "status": _status(s),
                "checkpoints_count": checkpoints_of(s),
                "display_name": _display_name(s),
                "user_metadata": {str(k): str(v) for k, v in s.user_metadata.items()} or None,
            }
            for s in page
        ],
        "next_cursor": next_cursor,
    }

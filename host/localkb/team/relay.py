"""The side panel's chat with a team: the host hands the turn to the team server and relays its stream.

When every knowledge base of a chat turn belongs to one attached team, the team server
answers it (its model, caches, caps, guardrails and query log apply; the user's token
says who asks) and the host forwards its SSE events to the side panel as the host's own
``step`` and ``token`` events, then returns its result as the chat reply — the panel
reads one stream shape whichever side answered. A mix of local and team knowledge bases,
or of two teams, is answered locally as before (each team searched by its server).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from localkb.errors import Cancelled, LocalKBError
from localkb.team.attached import Attachment, Library, TeamRecord


def team_of_turn(library: Library, kb_refs: Sequence[str]) -> Attachment | None:
    """The one attached team that holds every knowledge base named, else None."""
    if not kb_refs or not getattr(library, "teams", None):
        return None
    teams = set()
    for ref in kb_refs:
        try:
            rec = library.resolve(ref)
        except LocalKBError:
            return None
        if not isinstance(rec, TeamRecord):
            return None
        teams.add(rec.team)
    if len(teams) != 1:
        return None
    name = teams.pop()
    return next((t for t in library.teams if t.name == name), None)


def relay_turn(library: Library, team: Attachment, kb_refs: Sequence[str], message: str, *,
               history: list[dict] | None, k: int, regenerate: bool,
               emit: Callable[[str, dict], None], cancel: threading.Event | None = None) -> dict:
    ids = [library.resolve(ref).id for ref in kb_refs]

    def on_event(name: str, data: dict) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the chat turn was cancelled")
        if name in ("step", "token"):
            emit(name, data)

    with team.client() as client:
        result = client.chat_stream(ids, message, on_event=on_event, history=history or [],
                                    k=k, regenerate=regenerate)
    result["team"] = team.name
    return result

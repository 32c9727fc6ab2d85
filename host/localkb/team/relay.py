"""The side panel's chat with a team: the host hands the turn to the team server and relays its stream.

When every knowledge base of a chat turn belongs to one attached team, the team server
answers it (its model, caches, caps, guardrails and query log apply; the user's token
says who asks) and the host forwards its SSE events to the side panel as the host's own
``step`` and ``token`` events, then returns its result as the chat reply — the panel
reads one stream shape whichever side answered. A mix of local and team knowledge bases,
or of two teams, is answered locally as before (each team searched by its server).

What the team is handed passes the privacy gate first, with the team as the destination
(``privacy.team_placement``): the panel's history goes with only the assistant turns drawn
wholly from that team's knowledge bases (a turn quoting a device-only local knowledge base, or
one of unknown provenance, stays on this device), and a stopped answer is continued there only
when it was drawn from them too (otherwise ``PrivacyBlocked``, before anything is sent). The
team server gates what it receives again, against its own model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from localkb.answer.chat import ChatOptions, Turn, gate_continuation, gate_turns
from localkb.answer.privacy import team_placement
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
               history: Sequence[Turn], options: ChatOptions, regenerate: bool,
               emit: Callable[[str, dict], None], cancel: threading.Event | None = None) -> dict:
    """Hand one chat turn to ``team``'s server and relay its stream; what goes passes the gate."""
    ids = [library.resolve(ref).id for ref in kb_refs]
    placement = team_placement(team.name)
    gate_continuation(library, None, options, placement)  # raises before anything is sent
    turns, _ = gate_turns(library, None, history, placement)
    sent = [{"role": t.role, "content": t.content, **({"kbs": list(t.kbs)} if t.kbs is not None else {})}
            for t in turns]
    extra = ({"continue_from": options.continue_from, "continue_kbs": list(options.continue_kbs or ())}
             if options.continue_from else {})

    def on_event(name: str, data: dict) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the chat turn was cancelled")
        if name in ("step", "token", "provenance"):  # provenance: a stopped answer can be continued
            emit(name, data)

    with team.client() as client:
        result = client.chat_stream(ids, message, on_event=on_event, history=sent, k=options.k,
                                    regenerate=regenerate, **extra)
    result["team"] = team.name
    return result

"""Guardrails of team chat: input checks before anything runs, output checks before anything is sent.

Input (``check_input``), in this order, each a ``GuardrailBlocked`` with ``detail.rule``:
``empty`` (nothing but white space), ``too_long`` (over ``max_chars``), ``control_chars``
(C0/C1 controls other than tab and newlines, and the invisible bidirectional overrides that
make a text read differently from what it says), ``deny_list`` (a configured pattern; the
reply names the rule, never the text that matched it). They run on the message and on
every history turn, the user's and the assistant's, and on a stopped answer to continue
(each reaches the model), before the rate counter, the cache, the embedder or the model.

The deny list matches what a reader sees (``fold.py``): a phrase is folded, and matched
against the folded text, so zero-width and other format characters, look-alike Cyrillic
or Greek letters, full-width or mathematical forms and accents do not hide it; a
``name: regex`` rule runs over the text as sent and over its folded form.

Output (``check_output``), on the finished turn, before its result leaves the server:
``citation`` — every [n] in the answer names a citation of this turn, and every citation is
a passage this user may see now (the chunk exists, in a knowledge base of their access set,
at or below their level: read back from PostgreSQL, not taken from the turn's own word);
``privacy`` — when the model is not on the server's own machine, no device-only knowledge
base is among those the turn allowed, cited or drew on (the gate of ``answer/privacy.py``
ran before retrieval; this is its check after the fact).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localkb.errors import GuardrailBlocked, InvalidInput
from localkb.team.fold import fold
from localkb.team.store import TeamStore

MAX_CHARS = 4000
_ALLOWED_CONTROLS = {"\t", "\n", "\r"}
_BIDI = {"\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"}
_MARKER = re.compile(r"\[(\s*\d{1,4}\s*(?:[,;]\s*\d{1,4}\s*)*)\]")


@dataclass(frozen=True)
class DenyRule:
    name: str
    pattern: re.Pattern


@dataclass(frozen=True)
class Policy:
    max_chars: int = MAX_CHARS
    deny: tuple[DenyRule, ...] = field(default_factory=tuple)

    @classmethod
    def from_lines(cls, lines: Iterable[str], *, max_chars: int = MAX_CHARS) -> Policy:
        """A deny list, one rule a line: ``name: regex`` or a bare phrase (matched as words,
        folded: ``fold.py``); blank lines and ``#`` comments are skipped."""
        rules = []
        for n, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, rest = line.partition(":")
            if sep and re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", name.strip()) and rest.strip():
                name, expr = name.strip(), rest.strip()
            else:
                words = fold(line).split()
                if not words:
                    continue
                name, expr = f"rule-{n}", r"\b" + r"\s+".join(map(re.escape, words)) + r"\b"
            try:
                rules.append(DenyRule(name, re.compile(expr, re.IGNORECASE)))
            except re.error as err:
                raise InvalidInput(f"deny-list line {n} is not a valid pattern: {err}") from err
        return cls(max_chars=max_chars, deny=tuple(rules))

    @classmethod
    def from_file(cls, path: Path, *, max_chars: int = MAX_CHARS) -> Policy:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InvalidInput(f"the deny list {path} could not be read: {err}") from err
        return cls.from_lines(text.splitlines(), max_chars=max_chars)


def _block(rule: str, message: str, **detail) -> GuardrailBlocked:
    return GuardrailBlocked(message, detail={"rule": rule, "stage": "input", **detail})


def check_text(text: str, policy: Policy, *, field_name: str = "message") -> None:
    if not isinstance(text, str) or not text.strip():
        raise _block("empty", f"the {field_name} is empty", field=field_name)
    if len(text) > policy.max_chars:
        raise _block("too_long", f"the {field_name} is {len(text):,} characters, over the "
                     f"{policy.max_chars:,} allowed", field=field_name, limit=policy.max_chars)
    for i, ch in enumerate(text):
        if ch in _ALLOWED_CONTROLS:
            continue
        if unicodedata.category(ch) == "Cc" or ch in _BIDI:
            raise _block("control_chars", f"the {field_name} holds a control character "
                         f"(U+{ord(ch):04X} at position {i})", field=field_name, position=i)
    folded = fold(text) if policy.deny else text
    for rule in policy.deny:
        if rule.pattern.search(folded) or rule.pattern.search(text):
            raise _block("deny_list", f"the {field_name} is refused by this server's deny list "
                         f"(rule {rule.name!r})", field=field_name, name=rule.name)


def check_input(message: str, history: Sequence[dict] | None, policy: Policy, *,
                continue_from: str | None = None) -> None:
    """Every text the model will read: the message, each history turn, a stopped answer to continue."""
    check_text(message, policy)
    longer = Policy(max_chars=max(policy.max_chars, 32_000), deny=policy.deny)
    if isinstance(continue_from, str) and continue_from.strip():
        check_text(continue_from, longer, field_name="continue_from")
    for turn in history or ():
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            continue  # parse_history refuses it by name
        content = turn.get("content")
        if turn["role"] == "assistant" and (not isinstance(content, str) or not content.strip()):
            continue  # not text: parse_history refuses it; blank: nothing reaches the model
        # Every earlier turn, the user's and the assistant's, reaches the model as much as
        # the message does: a client may send any text as an "assistant" turn.
        check_text(content if isinstance(content, str) else "", longer, field_name="history")


def _output(rule: str, message: str, **detail) -> GuardrailBlocked:
    return GuardrailBlocked(message, detail={"rule": rule, "stage": "output", **detail})


def check_output(result: dict, store: TeamStore) -> dict:
    """Raise ``GuardrailBlocked`` unless the answer's citations and privacy hold; what was checked."""
    citations = result.get("citations") or []
    numbers = {c.get("n") for c in citations}
    marked: set[int] = set()
    for m in _MARKER.finditer(result.get("answer") or ""):
        marked.update(int(x) for x in re.split(r"[,;]", m.group(1)))
    stray = sorted(marked - numbers)
    if stray:
        raise _output("citation", "the answer cites passages it was not given: "
                      + ", ".join(f"[{n}]" for n in stray), numbers=stray)
    by_kb: dict[str, list[str]] = {}
    for c in citations:
        if not c.get("chunk_id") or not c.get("kb"):
            raise _output("citation", f"citation [{c.get('n')}] does not name its passage")
        by_kb.setdefault(c["kb"], []).append(c["chunk_id"])
    for kb_id, ids in by_kb.items():
        grant = store.access.grant(kb_id)
        if grant is None:
            raise _output("citation", "a citation points into a knowledge base outside your access",
                          kb=kb_id)
        with store.db.conn() as conn:
            seen = {r["id"] for r in conn.execute(
                "SELECT id FROM chunks WHERE kb_id = %s AND id = ANY(%s) AND access_level <= %s",
                (kb_id, ids, grant.level))}
        missing = [i for i in ids if i not in seen]
        if missing:
            raise _output("citation", "a citation points at a passage you may not see (or that "
                          "no longer exists)", kb=kb_id, chunks=missing)
    location = (result.get("model") or {}).get("location") or "device"
    drawn = set(result.get("kbs") or []) | set(by_kb)
    drawn |= set(((result.get("trace") or {}).get("privacy") or {}).get("allowed") or [])
    if location != "device" and drawn:
        for kb_id in sorted(drawn):
            rec = store.record(kb_id)
            if rec is None or rec.privacy != "cloud":
                raise _output("privacy", "a device-only knowledge base reached a model that is not "
                              "on this server's machine", kb=kb_id, location=location)
    return {"citations": len(citations), "kbs": sorted(drawn), "location": location}

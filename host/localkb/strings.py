"""Text from outside, checked once: what a store can hold, and what a name may be.

Every edge that takes strings from outside (request bodies through ``inputs``, ``.awkb`` files,
names typed at the CLI) asks these two functions, so the rules live in one place:

- ``string_problem``: a string the catalogue cannot store or that no real text contains: a
  lone surrogate (not valid Unicode; UTF-8 cannot encode it) or a NUL character.
- ``clean_name``: a name shown to the user (a knowledge base, an endpoint) in NFC, without
  control, format (RTL override, zero-width characters, BOM), surrogate, private-use,
  unassigned or line/paragraph-separator characters, so two names that look the same are
  the same name and no name can disguise what follows it.
"""

from __future__ import annotations

import re
import unicodedata

from localkb.errors import InvalidInput

_SURROGATE = re.compile("[\ud800-\udfff]")
# Cc control (incl. DEL), Cf format (U+202E, U+200B-U+200D, U+FEFF, ...), Cs surrogates,
# Co private use, Cn unassigned, Zl/Zp line and paragraph separators.
_REFUSED_IN_NAMES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def string_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (``None`` when it can)."""
    if "\x00" in value:
        return "contains a NUL character"
    if _SURROGATE.search(value):
        return "contains a lone surrogate (not valid Unicode text)"
    return None


#: The longest knowledge base name (``store.kb.check_name``); the extension's name fields
#: take it from the host's ``status`` reply.
KB_NAME_MAX = 80


def clean_name(value: object, *, what: str, max_len: int, forbid: str = "") -> str:
    """``value`` stripped and in NFC; ``InvalidInput`` naming the first character refused."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string")
    name = unicodedata.normalize("NFC", value.strip()) if not _SURROGATE.search(value) else value
    if not name or len(name) > max_len:
        raise InvalidInput(f"{what} must be 1-{max_len} characters")
    for ch in name:
        category = unicodedata.category(ch)
        if category in _REFUSED_IN_NAMES or ch in forbid:
            label = unicodedata.name(ch, "") if category != "Cs" else "a lone surrogate"
            raise InvalidInput(f"{what} may not contain U+{ord(ch):04X}"
                               + (f" ({label.lower()})" if label else "")
                               + (f" or any of {' '.join(forbid)}" if forbid else ""))
    return name

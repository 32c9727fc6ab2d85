"""Text folded for matching: what a reader sees, not which code points spell it.

``fold`` is what the deny list (``guard.py``) compares, on both sides: its phrases and the
text of every turn. In order: compatibility decomposition (NFKD: full-width, mathematical,
circled and ligature forms become plain letters; accented letters become a letter and its
accent); combining marks (``M*``) and format characters (``Cf``: zero-width space and
joiners, soft hyphen, word joiner, byte-order mark, tags) dropped; look-alike letters mapped
to the Latin letter they pass for; case folded; NFKC again.

The look-alike table is a compact subset of Unicode TR39's ``confusables.txt`` (the
prototypes of its MA table): the Cyrillic, Greek, Armenian and Latin-extension letters that
render like a basic Latin letter in common fonts. Letters that look like another Latin
letter (``l`` and ``I``, ``rn`` and ``m``) and digits are left alone: folding them would
refuse ordinary text.
"""

from __future__ import annotations

import unicodedata

_LOOK_ALIKES = {
    # Cyrillic
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s", "і": "i",
    "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ү": "y", "ӏ": "l",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J", "Ԛ": "Q", "Ԝ": "W", "Ү": "Y",
    "Һ": "H", "Ӏ": "l",
    # Greek
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "υ": "u", "ι": "i", "γ": "y", "η": "n", "ϲ": "c",
    "ϳ": "j", "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "Ϲ": "C", "Ϳ": "J",
    # Armenian
    "օ": "o", "ս": "u", "հ": "h", "ո": "n", "ց": "g",
    # Latin letters outside ASCII that pass for ASCII ones
    "ı": "i", "ȷ": "j", "ɑ": "a", "ɡ": "g", "ɩ": "i", "ʏ": "y",
}
_TABLE = str.maketrans(_LOOK_ALIKES)


def fold(text: str) -> str:
    """``text`` as a reader sees it: no invisible or combining marks, look-alikes as Latin, case folded."""
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(ch for ch in decomposed if unicodedata.category(ch)[0] != "M"
                   and unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFKC", kept.translate(_TABLE).casefold())

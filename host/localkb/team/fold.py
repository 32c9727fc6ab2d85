"""Text folded for matching: what a reader sees, not which code points spell it.

``fold`` is what the deny list (``guard.py``) compares, on both sides: its phrases and the
text of every turn. In order: compatibility decomposition (NFKD: full-width, mathematical,
circled and ligature forms become plain letters; accented letters become a letter and its
accent); combining marks (``M*``) and format characters (``Cf``: zero-width space and
joiners, soft hyphen, word joiner, byte-order mark, tags) dropped; look-alike letters mapped
to the Latin letter they pass for; case folded; NFKC again.

The look-alike table is Unicode TR39's ``confusables.txt`` (Unicode 14.0) cut down to
what a deny list needs: every Latin, Greek, Cyrillic or Armenian letter that NFKD leaves
as it is and that TR39 maps to one basic Latin letter (an upper-case one that TR39 maps to
``l`` maps to ``I`` here, since case is folded after). Basic Latin letters that look like
each other (``l`` and ``I``, ``rn`` and ``m``) and digits are left alone: folding them
would refuse ordinary text.
"""

from __future__ import annotations

import unicodedata

_FROM = "".join((
    "ÐØøĐđĦħıŁłŦŧƀƂƃƄƉƌƍƑƒƖƗƙƚƝƞƟƥƦƭƮƴƵƶƽ",
    "ǀǤǥȤȥȼȾɄɆɇɈɉɍɎɏɑɓɖɗɠɡɣɦɨɩɪɫɭɯɳɵɼɽʂʋʏ",
    "ʐʠͿΑΒΕΖΗΘΙΚΜΝΟΡΤΥΧαγηθινορσυϜϳϺЅІЈАБ",
    "ВЕКМНОРСТУХЬагеорсухѕіјћѡѢѣѲѳѴѵѽҌҍғҚ",
    "ҞҢҪҫҬҮүҰұҲһҽҿӀӇӉӍӏӨөԁԌԛԜԝՍՏՕագզհոռսց",
    "քօᴄᴏᴑᴜᴠᴡᴢᴦᵮᵰᵲᵴᵵᵶᵻᵼᵽᵾᶃᶌẝỿⱧⱩꙇꚕꜱꝀꝊꝋꝡꞘꞙꞟ",
    "ꞲꞳꞴꬲꬵꬽꬾꭇꭈꭎꭒꭚ𝈍𝈓𝈖𝈚𝈪",
))
_TO = "".join((
    "DOoDdHhiLlTtbbbbDdgFfIIklNnOpRtTyZzs",
    "lGgZzcTUEeJjrYyabddggyhiiillwnorrsuy",
    "zqJABEZHOIKMNOPTYXaynOivopouFjMSIJAb",
    "BEKMHOPCTYXbareopcyxsijhwbbOoVvwbbrK",
    "KHCcTYyYyXheeIHHMiOodGqWwUSOwqqhnnug",
    "focoouvwzrfnrstziipugyfyHKihsKOowFfu",
    "JXBefoorruuyVFROL",
))
_TABLE = str.maketrans(_FROM, _TO)


def fold(text: str) -> str:
    """``text`` as a reader sees it: no invisible or combining marks, look-alikes as Latin, case folded."""
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(ch for ch in decomposed if unicodedata.category(ch)[0] != "M"
                   and unicodedata.category(ch) != "Cf")
    # Mapped before case folding (Cyrillic capital VE passes for B, its small letter for no
    # Latin letter), and again after it (U+2C6D is not in the table, its lower case is).
    folded = kept.translate(_TABLE).casefold().translate(_TABLE).casefold()
    return unicodedata.normalize("NFKC", folded)

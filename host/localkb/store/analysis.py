"""What a text is indexed under, and what a query asks for — independent of any engine.

Every keyword engine (Whoosh here; tantivy and PostgreSQL tsvectors can take the same
data) indexes the ``(term, position)`` pairs of ``analyze`` and answers the ``QueryPlan``
of ``plan_query``. Nothing in this module knows an engine: terms and phrases are plain
strings and tuples.

Indexing a text:

- a trailing English possessive is no part of a token (``Alzheimer's`` is ``Alzheimer``);
- a plain word is lower-cased and Porter-stemmed; English, French and German stopwords
  give no term but still take a position (so ``Task is done`` is not the phrase ``task done``),
  unless written as an abbreviation (``NO``, ``ER``, ``ALS``: a capital after the first letter);
- a code-like token (anything not purely alphabetic: ``ERR_4521``, ``e-mail``,
  ``asyncio.Task.done``) gives its whole lower-cased form, its qualified suffixes
  (``task.done``: the parts after each ``.``, ``:`` or ``/``), each at the position where
  it starts, and its parts (``asyncio``, ``task``, ``done``), one position each, so the
  parts can be matched as an adjacent phrase;
- a version (``v2.3``, ``V2.3``, or a dotted number ``2.3``, as in "version 2.3") gives the
  one term ``v2.3``; ``2.3.1`` gives ``v2.3.1`` and never ``v2.3``;
- a call signature in text (``Task.done()``, ``os.replace(src, dst)``) indexes its name:
  parentheses are never part of a token.

Asking: plain words are OR-ed and scored by BM25. A code-like token of the query that no
passage of a knowledge base holds whole backs off to its parts as words (``p53-dependent``:
``p53``, ``depend``), as the index holds them: they add to a passage's score, and never
count as the token matched (``QueryPlan.parts``). Exact terms (identifier-shaped tokens,
``is_exact_token``) are asked whole first; a knowledge base with no whole match backs off
to the alternatives of ``ExactTerm.backoff``: qualified suffixes and the parts as an
adjacent phrase, the dropped qualifier required elsewhere on the same page — never the
loose parts alone, so ``ERR_4521`` never matches ``ERR_4512`` and ``SKU-88-A`` never
``SKU-88-B``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

MAX_QUERY_TERMS = 12
#: A token: word characters joined by single hyphens, dots, slashes, colons or apostrophes,
#: less an English possessive (either apostrophe): ``ERR_4521's`` and ``Alzheimer's`` are
#: ``ERR_4521`` and ``Alzheimer`` (as Lucene's EnglishPossessiveFilter has it), so a question
#: that writes the possessive asks for the name the pages write. The group is the token
#: (``findall`` returns it); the possessive is matched after it, so it never becomes a token
#: ``s`` of its own. A backslash that opens a word with a letter (after white space, a
#: bracket or a quote) is part of the name: ``\\lo_export`` and ``\\copy`` are psql's
#: commands, not the server function ``lo_export`` or the word ``copy`` (so too escapes,
#: regular-expression classes and TeX macros: ``\\n``, ``\\d``, ``\\section``); inside a
#: word or a path (``a\\b``, ``C:\\Users``), or before a digit or ``_`` (``\\0``,
#: Markdown's ``\\_``), it separates, as before.
TOKEN_PATTERN = (r"((?:(?<![^\s(\[{<`'\"‘“])\\(?=[^\W\d_]))?"  # noqa: S105 - a regex
                 r"\w+(?:[-./:]\w+|['’](?![sS](?!\w))\w+)*)(?:['’][sS](?!\w))?")
TOKEN = re.compile(TOKEN_PATTERN, re.UNICODE)
_JOINERS = re.compile(r"[-_./:'’\\]")
#: Qualifier separators: what splits ``asyncio.Task.done`` into ``asyncio``, ``Task``, ``done``.
_QUALIFIERS = re.compile(r"[./:]")
_VERSION = re.compile(r"^[vV]?(\d+(?:\.\d+)+)$")
#: camelCase, a name made of words: a capital that starts a lower-case word after a lower-case
#: letter (``getElementById``, ``AlphaBeta``), or a capital prefix, a lower-case word and
#: another capital (``PQbackendPID``). A lower-case prefix on an acronym (``mRNA``, ``siRNA``,
#: ``iPSC``, ``mTOR``) or an acronym's plural (``RNAs``) is a word of a field's vocabulary.
_CAMEL = re.compile(r"[a-z][A-Z][a-z]|^[A-Z]{2,}[a-z]+[A-Z]")
#: Qualified names with more components than this are paths or URLs: suffixes stop here.
MAX_COMPONENTS = 6


@lru_cache(maxsize=1)
def stopwords() -> frozenset[str]:
    from whoosh.lang import stopwords_for_language

    words: set[str] = set()
    for lang in ("en", "fr", "de"):
        words |= set(stopwords_for_language(lang))
    return frozenset(words)


@lru_cache(maxsize=100_000)
def stem(word: str) -> str:
    from whoosh.lang.porter import stem as porter

    return porter(word)


def is_code_like(token: str) -> bool:
    """Anything that is not a plain alphabetic word: it must match as a whole."""
    return not token.isalpha()


def is_identifier(term: str) -> bool:
    """An identifier (``err_4521``, ``v2.3``, ``sku-88-a``, ``il-6``): letters and digits, or an underscore.

    Hyphenated words (``non-small``) and bare numbers are code-like but not identifiers.
    """
    return "_" in term or (any(c.isdigit() for c in term) and any(c.isalpha() for c in term))


def version_term(token: str) -> str | None:
    """``v2.3`` for ``v2.3``, ``V2.3`` and ``2.3``; None for anything that is not a dotted version."""
    m = _VERSION.match(token)
    return f"v{m.group(1)}" if m else None


def is_qualified_name(token: str) -> bool:
    """``asyncio.Task.done``, ``tomllib.dumps``, ``pg_trgm.similarity_threshold``; not ``e.g`` or ``U.S``."""
    parts = [p for p in _QUALIFIERS.split(token) if p]
    return (len(parts) >= 2 and sum(len(p) >= 2 for p in parts) >= 2
            and any(not p.isdigit() for p in parts))


def is_exact_token(token: str, *, shouting: bool = False) -> bool:
    """Whether a query token, as typed, names something that must be matched exactly.

    Identifiers (letters with digits, or an underscore), versions, qualified names,
    backslash commands (``\\copy``), and words whose case marks them as names:
    ``camelCase`` (words joined by capitals that start each new word: ``getElementById``;
    not ``mRNA``, ``siRNA`` or ``mTOR``, where a lower-case letter prefixes an acronym —
    words of a field's vocabulary, written that way in prose) and ALL-CAPS of four letters
    or more (``PYTHONHASHSEED``), the latter unless the whole query is in capitals
    (``shouting``). Hyphenated words and bare numbers are not: ``e-mail``, ``8008``.
    """
    if version_term(token) or token.startswith("\\"):
        return True
    if token.isalpha():
        if _CAMEL.search(token):
            return True
        return not shouting and len(token) >= 4 and token.isupper()
    low = token.lower()
    return is_identifier(low) or is_qualified_name(token)


def is_abbreviation(token: str) -> bool:
    """A word with a capital after its first letter (``NO``, ``ER``, ``ALS``, ``miR``): an
    abbreviation or a name, never a function word, which prose writes in lower case or with
    only its first letter capital (``The``)."""
    return any(c.isupper() for c in token[1:])


def normalize(token: str, *, keep_stopwords: bool = False) -> str | None:
    """The indexed form of one token: lower case, stemmed if a plain word; None if a stopword.

    A stopword written as an abbreviation (``is_abbreviation``) is a word: the stopwords of
    three languages hold words that are abbreviations in any field (French ``es``, ``par``;
    German ``er``, ``als``; English ``no``, ``who``), so nitric oxide (``NO``), the
    endoplasmic reticulum (``ER``), ALS and ``IS NULL`` keep their terms.
    """
    low = token.lower()
    if not keep_stopwords and low in stopwords() and not is_abbreviation(token):
        return None
    if is_code_like(low):
        return version_term(low) or low
    return stem(low)


def _parts(token: str) -> list[str]:
    """The atoms of a code-like token, normalised (stopwords kept: they are part of a name)."""
    out = []
    for part in _JOINERS.split(token):
        norm = normalize(part, keep_stopwords=True) if part else None
        if norm:
            out.append(norm)
    return out


def components(token: str) -> list[str]:
    """The qualified components of a name as typed: ``asyncio.Task.done`` -> asyncio, Task, done."""
    return [p for p in _QUALIFIERS.split(token) if p]


def component_starts(token: str) -> list[int]:
    """Where each qualified component of ``token`` starts (0 first)."""
    return [0] + [m.end() for m in _QUALIFIERS.finditer(token)]


@lru_cache(maxsize=200_000)
def token_terms(token: str) -> tuple[tuple[tuple[str, int], ...], int]:
    """Terms of one token with offsets from its first position, and how many positions it takes."""
    whole = normalize(token)
    if whole is None:
        return (), 1
    if not is_code_like(token.lower()) or version_term(token):
        return ((whole, 0),), 1
    parts = _parts(token)
    if len(parts) <= 1:
        return ((whole, 0),), 1
    terms: list[tuple[str, int]] = [(whole, 0)]
    starts = component_starts(token)
    if 3 <= len(starts) <= MAX_COMPONENTS:
        offset = 0
        for i in range(1, len(starts) - 1):
            offset += len(_parts(token[starts[i - 1] : starts[i]]))
            terms.append((token[starts[i] :].lower(), offset))
    terms.extend((part, i) for i, part in enumerate(parts))
    return tuple(terms), len(parts)


#: ``token_terms`` of each token seen, shaped for ``analyze``'s loop: a plain term (one term at
#: offset 0, width 1: most tokens) as the bare string, a stopword as None, anything else as
#: ``(terms, width)``. A plain dict, emptied when full: a lookup costs less than an lru_cache
#: call and its tuple unpacking, which was a third of an import's analysis.
_ANALYZED: dict[str, str | tuple[tuple[tuple[str, int], ...], int] | None] = {}
_ANALYZED_MAX = 200_000


def _analyzed(token: str) -> str | tuple[tuple[tuple[str, int], ...], int] | None:
    terms, width = token_terms(token)
    if not terms and width == 1:
        entry = None
    elif width == 1 and len(terms) == 1 and terms[0][1] == 0:
        entry = terms[0][0]
    else:
        entry = (terms, width)
    if len(_ANALYZED) >= _ANALYZED_MAX:
        _ANALYZED.clear()
    _ANALYZED[token] = entry
    return entry


def tokens(text: str) -> list[str]:
    """``TOKEN.findall(text)``, 2-3x faster on prose.

    No token spans white space (``\\w`` and the joiners hold none), so the text is split on it
    first, and a piece that is all word characters but ``_`` (``str.isalnum``: what ``\\w``
    matches, less the underscore) is one token whole; only the other pieces go to the regex.
    """
    out: list[str] = []
    append, extend, findall = out.append, out.extend, TOKEN.findall
    for piece in text.split():
        if piece.isalnum():
            append(piece)
        else:
            extend(findall(piece))
    return out


def analyze(text: str) -> list[tuple[str, int]]:
    """Every ``(term, position)`` a text is indexed under, in order."""
    out: list[tuple[str, int]] = []
    append = out.append
    get = _ANALYZED.get
    pos = 0
    for token in tokens(text):
        entry = get(token, _ANALYZED)  # the dict itself marks "not seen": None is a stopword
        if entry is _ANALYZED:
            entry = _analyzed(token)
        if entry.__class__ is str:
            append((entry, pos))
            pos += 1
        elif entry is None:
            pos += 1
        else:
            terms, width = entry
            for t, off in terms:
                append((t, pos + off))
            pos += width
    return out


#: What joins the parts of one code name (``snake_case``, ``module.attr``); a hyphen or a
#: slash joins words of prose as often (``p53-dependent``, ``Th1/Th2``).
_NAME_JOINERS = re.compile(r"[_.]")


def named_terms(text: str) -> set[str]:
    """The names a text writes: each token's whole term and a qualified name's suffixes, not
    the parts of a longer code name (``macaddr8_set7bit`` names neither ``macaddr8`` nor
    ``set7bit``; ``pg_trgm.similarity_threshold`` not ``pg_trgm``). The parts of a compound
    joined only by hyphens or slashes are named too: ``p53-dependent apoptosis`` is about p53.
    """
    out: set[str] = set()
    for token in tokens(text):
        terms, width = token_terms(token)
        if width > 1 and _NAME_JOINERS.search(token):
            terms = terms[: len(terms) - width]  # one position per part, and the parts come last
        out.update(t for t, _ in terms)
    return out


def index_terms(token: str) -> tuple[str, ...]:
    """Terms a document token is indexed under: the whole token first, then suffixes and parts."""
    seen: list[str] = []
    for t, _ in token_terms(token)[0]:
        if t not in seen:
            seen.append(t)
    return tuple(seen)


@dataclass(frozen=True)
class Alternative:
    """One back-off form of an exact term: adjacent terms in order, on a page that holds ``context``."""

    phrase: tuple[str, ...]
    context: tuple[str, ...] = ()
    label: str = ""

    def to_dict(self) -> dict:
        return {"phrase": list(self.phrase), "context": list(self.context), "label": self.label}


@dataclass(frozen=True)
class ExactTerm:
    """An exact term of a query: as typed, its whole indexed form, and its back-off forms."""

    text: str
    term: str
    backoff: tuple[Alternative, ...] = ()


@dataclass(frozen=True)
class QueryPlan:
    """What a query asks for: the OR-ed terms (exact wholes included) and its exact terms.

    ``parts``: each code-like term with its parts (those that are not terms of the query
    themselves, stopwords left out). A knowledge base that holds no such term whole asks for
    its parts beside the terms: a compound the page writes otherwise ("depends on p53" for
    ``p53-dependent``) still shares its words with the question. The parts score those words
    and are never counted as the term matched (``ERR_4512``'s ``err`` is no match of
    ``ERR_4521``); where the term is held whole, only the whole is asked.
    """

    terms: tuple[str, ...]
    exact: tuple[ExactTerm, ...]
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_dict(self) -> dict:
        return {"terms": list(self.terms), "parts": {t: list(p) for t, p in self.parts},
                "exact": [{"text": e.text, "term": e.term,
                           "backoff": [a.to_dict() for a in e.backoff]} for e in self.exact]}


def _qualifier_terms(comps: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for c in comps:
        norm = normalize(c, keep_stopwords=True)
        if norm and norm not in out:
            out.append(norm)
    return tuple(out)


def backoff(token: str) -> tuple[Alternative, ...]:
    """The back-off forms of an exact term, most specific first (none for versions and plain words).

    ``asyncio.Task.done``: the phrase ``asyncio task done``; the suffix ``task.done`` and the
    phrase ``task done``, each on a page that also holds ``asyncio``. A suffix that is a
    single plain word (``dumps`` of ``tomllib.dumps``) is a loose part and never used.
    """
    if version_term(token) or token.isalpha():
        return ()
    parts = _parts(token)
    out: list[Alternative] = []
    # The parts as a phrase: ``ERR 4521`` for ``ERR_4521``; not for words joined by ``_`` or
    # ``-`` alone, whose parts in a row are ordinary prose ("sync replication slot" is not
    # ``sync_replication_slots``, and the stemmed parts could not tell ``slot`` from ``slots``).
    if len(parts) >= 2 and (any(c.isdigit() for c in token) or len(component_starts(token)) > 1):
        out.append(Alternative(tuple(parts), (), " ".join(_JOINERS.split(token))))
    starts = component_starts(token)
    if 2 <= len(starts) <= MAX_COMPONENTS:
        for i in range(1, len(starts)):
            suffix = token[starts[i] :]
            if len(starts) - i == 1 and not is_code_like(suffix.lower()):
                break  # a loose part
            context = _qualifier_terms(components(token[: starts[i] - 1]))
            out.append(Alternative((suffix.lower(),), context, suffix))
            sparts = _parts(suffix)
            if len(sparts) >= 2:
                out.append(Alternative(tuple(sparts), context, " ".join(_JOINERS.split(suffix))))
    unique: list[Alternative] = []
    for alt in out:
        if alt.phrase not in {a.phrase for a in unique}:
            unique.append(alt)
    return tuple(unique)


def plan_query(query: str) -> QueryPlan:
    """Whole, normalised, de-duplicated query terms (at most 12) and the exact ones among them."""
    shouting = not any(c.islower() for c in query)
    terms: list[str] = []
    exact: list[ExactTerm] = []
    parts: dict[str, list[str]] = {}
    for token in tokens(query):  # none starts or ends with an apostrophe (TOKEN_PATTERN)
        # In a question typed in capitals, capitals mark no abbreviation.
        norm = normalize(token.lower() if shouting else token)
        if not norm:
            continue
        if is_exact_token(token, shouting=shouting) and norm not in {e.term for e in exact}:
            exact.append(ExactTerm(token, norm, backoff(token)))
        if norm not in terms:
            terms.append(norm)
        # The parts the index holds for this token (none for plain words and versions).
        own = [t for t in _parts(token) if t not in stopwords()] if len(token_terms(token)[0]) > 1 else []
        if own and norm not in parts:
            parts[norm] = own
        if len(terms) == MAX_QUERY_TERMS:
            break
    backoff_parts = tuple((t, tuple(dict.fromkeys(p for p in ps if p not in terms)))
                          for t, ps in parts.items())
    return QueryPlan(tuple(terms), tuple(exact), tuple((t, ps) for t, ps in backoff_parts if ps))


def query_terms(query: str) -> list[str]:
    """Whole, normalised, de-duplicated query terms (at most 12); code-like terms never split."""
    return list(plan_query(query).terms)

"""Token-aware chunking: at most N model tokens per passage (Settings: 96), title prefix included.

Splits at headings, then paragraphs, then sentences, then words; packs the
pieces greedily with a small overlap; never lets a chunk span two sections (PDF pages,
slides, sheets, chapters), and starts every chunk of a section with its heading if it has one. A
heading or a definition term (a line followed by a ``: description`` line) never
ends a passage: it starts the next one with what it introduces. A passage cut from a
fenced code block is fenced as the block is (its fence lines counted in its tokens).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

from localkb.ingest.extract import SYNOPSIS_FENCE, Document

TokenCounter = Callable[[Sequence[str]], list[int]]

_HEADING = re.compile(r"^#{1,6}\s")
_PARAGRAPHS = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+(?=[\"'(\[]?[A-Z0-9À-Ý])|\n")
TITLE_PREFIX_CHARS = 120
#: How a definition's description line starts (the Markdown-extra / pandoc convention).
DEFINITION = ": "


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    page: int | None
    tokens: int


def title_prefix(title: str | None) -> str:
    """The short title line put in front of every passage of a source."""
    title = (title or "").strip()
    if len(title) > TITLE_PREFIX_CHARS:
        title = title[:TITLE_PREFIX_CHARS].rsplit(" ", 1)[0] + "…"
    return title


def passage_text(title: str | None, body: str) -> str:
    """What is embedded and keyword-indexed for a chunk: title line, then the body."""
    prefix = title_prefix(title)
    return f"{prefix}\n{body}" if prefix else body


#: Markup before a line's first word: table bars, list marks, emphasis and code quotes.
_LEAD_MARKUP = re.compile(r"^[\s|>*_`~+-]*")
#: What follows a name that a line introduces: a call signature or a "name — purpose" line.
_INTRODUCED = re.compile(r"^[`*_\s]*(?:\(|—|→)")
_FIRST_WORD = re.compile(r"\w+(?:[-./:]\w+)*")
#: The name a declaration gives before its parameter list: ``lo_close(`` in a C prototype,
#: ```pg_mcv_list_items` (`` in a function synopsis.
_DECLARED = re.compile(r"(\w+(?:[.:]\w+)*)[`*]*[ \t]*\(")
#: An emphasised part of a definition term: a placeholder (DocBook's ``replaceable``, a
#: Sphinx parameter), ``*`mxid_age`*`` in ``--min-mxid-age *`mxid_age`*``, not what it defines.
_PLACEHOLDER = re.compile(r"(?<![*\w])\*(?!\*)[^*\n]+?(?<!\*)\*(?![*\w])")
#: A fence line: it opens a code block (its info string saying what kind) or closes one.
_FENCE = "```"


#: How strongly a span defines what it names: the name's own entry (the title, a heading, a
#: definition term, a signature, a ``name — purpose`` line), or a row of a listing (a table's
#: first cell that is only a name).
OWN_ENTRY, LISTING_ROW = 2, 1


def defining_spans(title: str | None, body: str) -> list[str]:
    """The parts of a passage that introduce a name rather than mention it.

    The page title, headings (``# ...``), definition terms (a line followed by a ``:``
    description line, as HTML ``dt``/``dd`` and Sphinx signatures are written), and the
    name a line opens with when that line is a table row (its first cell names the row) or
    a signature (``jsonb_set ( ... )``, ``Task.done()``) or a ``name — purpose`` line
    (manual pages); and a synopsis line (in a `````synopsis`` block, as extraction writes
    DocBook's ``pre.synopsis``) declares the name before its parameter list. Documentation
    of any kind names what it defines in one of these places; other fenced code never
    defines (an example's calls are uses, its ``# comments`` would read as headings).
    """
    return [span for span, _ in defining_spans_ranked(title, body)]


def defining_spans_ranked(title: str | None, body: str) -> list[tuple[str, int]]:
    """``defining_spans`` with how strongly each defines: ``OWN_ENTRY`` or ``LISTING_ROW``."""
    spans = [(title, OWN_ENTRY)] if title else []
    lines = body.split("\n")
    in_code = synopsis = False
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith(_FENCE):
            in_code = not in_code
            synopsis = in_code and text == SYNOPSIS_FENCE
            continue
        if synopsis:
            # A synopsis line declares the name before its parameter list
            # (``int lo_close(PGconn *conn, int fd);``); a command's grammar (``| CURRENT_ROLE``,
            # ``FROM from_item``) declares nothing (the command is the page's title).
            name = _DECLARED.search(text)
            if name:
                spans.append((name.group(1), OWN_ENTRY))
            continue
        if in_code or not text or text.startswith(":"):
            continue  # code (a ``# comment`` in an example is no heading) and descriptions
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        prev = lines[i - 1].strip() if i else ""
        # A run of ``#`` lines is a comment block of an example (cut from its fence by the
        # chunker), not headings: a heading stands between blank lines or prose.
        heading = _HEADING.match(text) and not (prev.startswith("#") or nxt.startswith("#"))
        if heading or nxt == ":" or nxt.startswith(DEFINITION):
            spans.append((text if heading else _PLACEHOLDER.sub("", text), OWN_ENTRY))
            continue
        rest = text[_LEAD_MARKUP.match(text).end():]
        word = _FIRST_WORD.match(rest)
        if word and _INTRODUCED.match(rest[word.end():]):
            spans.append((word.group(0), OWN_ENTRY))
        elif word and text.startswith("|"):
            spans.append((word.group(0), LISTING_ROW))
    return spans


@dataclass
class _Piece:
    text: str
    tokens: int
    heading: bool = False
    term: bool = False  # a definition term: the line before a ": description" line
    #: The fence line of the code block the piece starts in (``None``: not in one), and of
    #: the one it ends in: a passage cut from a code block is fenced as the block is.
    code_in: str | None = None
    code_out: str | None = None

    @property
    def leads(self) -> bool:
        """Headings and definition terms introduce what follows: they never end a passage."""
        return self.heading or self.term


def _fence_after(text: str, code: str | None) -> str | None:
    """The code block open after ``text`` (its fence line), given the one open before it."""
    for line in text.split("\n"):
        fence = line.strip()
        if fence.startswith(_FENCE):
            code = None if code is not None else fence
    return code


def _blocks(text: str) -> list[tuple[str, bool]]:
    """Paragraphs, with headings marked so a chunk can start at them.

    Each entry of a definition list (a term line, then its ``: description``) is a block of
    its own: extraction writes a list's entries as one paragraph, and cut by sentences the
    term of one entry would otherwise go with the end of the description before it. In a
    fenced code block nothing is a heading or a term (a ``# comment`` is code).
    """
    out: list[tuple[str, bool]] = []
    code: str | None = None
    for para in _PARAGRAPHS.split(text):
        lines = [ln for ln in para.strip().split("\n") if ln.strip()]
        buf: list[str] = []
        for i, line in enumerate(lines):
            was, code = code, _fence_after(line, code)
            if was is not None or code is not None:
                buf.append(line)
                continue
            term = (i + 1 < len(lines) and lines[i + 1].startswith(DEFINITION)
                    and not line.startswith(DEFINITION))
            if _HEADING.match(line):
                if buf:
                    out.append(("\n".join(buf), False))
                    buf = []
                out.append((line, True))
            else:
                if term and buf:
                    out.append(("\n".join(buf), False))
                    buf = []
                buf.append(line)
        if buf:
            out.append(("\n".join(buf), False))
    return out


def _split_long(text: str, budget: int, count: TokenCounter) -> list[_Piece]:
    """Sentences, and word windows for sentences that alone exceed the budget.

    A description's leading ``: `` mark stays with its first sentence (it is no sentence of
    its own), so the term before it still reads as a term.
    """
    sentences: list[str] = []
    for line in text.split("\n"):
        mark = DEFINITION if line.startswith(DEFINITION) else ""
        parts = [s.strip() for s in _SENTENCE.split(line[len(mark):]) if s and s.strip()]
        if mark and parts:
            parts[0] = mark + parts[0]
        sentences.extend(parts)
    sizes = count(sentences)
    pieces: list[_Piece] = []
    for sentence, size in zip(sentences, sizes, strict=True):
        if size <= budget:
            pieces.append(_Piece(sentence, size))
            continue
        words = sentence.split()
        # A "word" longer than 200 characters (a URL, a blob) is cut so windows stay bounded.
        words = [w[i : i + 200] for w in words for i in range(0, len(w), 200)]
        wsizes = count(words)
        cur: list[str] = []
        cur_tokens = 0
        for word, wsize in zip(words, wsizes, strict=True):
            if cur and cur_tokens + wsize > budget:
                pieces.append(_Piece(" ".join(cur), cur_tokens))
                cur, cur_tokens = [], 0
            cur.append(word)
            cur_tokens += wsize
        if cur:
            pieces.append(_Piece(" ".join(cur), cur_tokens))
    return pieces


def _pieces(text: str, budget: int, count: TokenCounter, fence: int) -> list[_Piece]:
    """``fence``: the tokens of a fence line and its newline (a code block's pieces leave room
    for the two a passage cut from the block gets)."""
    blocks = _blocks(text)
    sizes = count([b for b, _ in blocks])
    pieces: list[_Piece] = []
    code: str | None = None
    for (block, heading), size in zip(blocks, sizes, strict=True):
        room = budget - 2 * fence if code is not None or _FENCE in block else budget
        pieces.extend([_Piece(block, size, heading)] if size <= room
                      else _split_long(block, room, count))
        code = _fence_after(block, code)
    code = None
    for piece in pieces:
        piece.code_in = code
        piece.code_out = code = _fence_after(piece.text, code)
    # A definition list ("term" then ": description", as extract.py writes HTML dl/dt/dd and
    # Sphinx signatures): the term goes with its description.
    for piece, nxt in pairwise(pieces):
        if nxt.text.startswith(DEFINITION) and not piece.text.startswith(DEFINITION):
            piece.term = True
    return pieces


def _pack(pieces: list[_Piece], budget: int, overlap: int, fence: int) -> list[tuple[str, int]]:
    chunks: list[tuple[str, int]] = []
    cur: list[_Piece] = []

    def size(ps: list[_Piece]) -> int:
        # +1 for the newline joining pieces, which the tokenizer may count as nothing or one token;
        # a passage that starts or ends inside a code block gets the block's fence there.
        return (sum(p.tokens + 1 for p in ps)
                + (fence if ps and ps[0].code_in else 0) + (fence if ps and ps[-1].code_out else 0))

    def flush(ps: list[_Piece]) -> None:
        if ps and any(not p.heading for p in ps):
            lines = [p.text for p in ps]
            # A fence line alone where the passage starts or ends inside the block closes
            # or opens it there: it goes, and no fence is added for it.
            opens, closes = ps[0].code_in, ps[-1].code_out
            if opens and lines[0].strip().startswith(_FENCE) and len(lines) > 1:
                lines, opens = lines[1:], None
            if closes and lines[-1].strip().startswith(_FENCE) and len(lines) > 1:
                lines, closes = lines[:-1], None
            if opens:
                lines.insert(0, opens)
            if closes:
                lines.append(_FENCE)
            if not all(line.strip().startswith(_FENCE) for line in lines):
                chunks.append(("\n".join(lines), size(ps)))

    for piece in pieces:
        fits = size([*cur, piece]) <= budget
        starts_section = piece.leads and size(cur) > budget // 3
        if cur and (not fits or starts_section):
            # A heading or definition term at the end moves on with what it introduces.
            carry: list[_Piece] = []
            while cur and cur[-1].leads and size([cur[-1], *carry, piece]) <= budget:
                carry.insert(0, cur.pop())
            flush(cur)
            tail = cur[-1] if cur else None
            if carry:
                cur = carry
            elif (tail is not None and not starts_section and not tail.leads
                  and tail.tokens <= overlap and size([tail, piece]) - 1 <= budget):
                # (- 1: the overlap's one joining newline, as counted before fences were)
                cur = [tail]
            else:
                cur = []
        cur.append(piece)
    flush(cur)
    return chunks


def chunk_document(doc: Document, count: TokenCounter, *, max_tokens: int, overlap: int) -> list[Chunk]:
    """Chunks of ``doc`` whose ``passage_text`` fits in ``max_tokens`` model tokens.

    The sizes come from ``Settings`` (``max_chunk_tokens``, ``chunk_overlap_tokens``).
    """
    return [c for block in iter_chunks(doc, count, max_tokens=max_tokens, overlap=overlap) for c in block]


def iter_chunks(doc: Document, count: TokenCounter, *, max_tokens: int,
                overlap: int) -> Iterator[list[Chunk]]:
    """``chunk_document`` as a stream: the chunks of each section as that section is read."""
    prefix = title_prefix(doc.title)
    prefix_tokens = count([prefix])[0] + 1 if prefix else 0
    # [CLS] and [SEP] take two of the model's tokens; keep a small margin for joins.
    budget = max(32, max_tokens - 2 - prefix_tokens - 2)
    fence = count([SYNOPSIS_FENCE])[0] + 1
    n = 0
    for section in doc.iter_sections():
        block = []
        # A section's heading (a slide, a sheet with its header row) leads each of its passages.
        # One too long for that (a sheet of many columns) leads with its first line, cut short.
        heading = section.heading
        lead = count([heading])[0] + 1 if heading else 0
        if lead > budget // 2:
            heading = heading.split("\n", 1)[0][:100]
            lead = count([heading])[0] + 1
        room = max(32, budget - lead)
        for text, tokens in _pack(_pieces(section.text, room, count, fence), room, overlap, fence):
            body = f"{heading}\n{text}" if heading else text
            block.append(Chunk(n, body, section.page, tokens + lead + prefix_tokens + 2))
            n += 1
        yield block

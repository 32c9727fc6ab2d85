"""Turn bytes into text: a web page's whole content in page order, PDF pages (pypdf), text and Markdown."""

from __future__ import annotations

import codecs
import contextlib
import io
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from localkb.errors import EmptyDocument, InvalidDocument


@dataclass
class Section:
    """A run of text from one place in the document (one PDF page, or the whole page)."""

    text: str
    page: int | None = None
    #: What leads every passage cut from the section (a slide's, a sheet's, a chapter's
    #: heading line), so each names where it is from; ``None``: the text's own headings only.
    heading: str | None = None


@dataclass
class Document:
    """Extracted text with what is known about where it came from."""

    title: str
    type: str  # html | pdf | text | markdown
    sections: list[Section] = field(default_factory=list)
    url: str | None = None
    file_name: str | None = None
    lang: str | None = None
    #: The rest of a document read as a stream (a big file): sections not in memory yet.
    stream: Iterator[Section] | None = None
    page_count: int | None = None

    @property
    def text(self) -> str:
        return "\n\n".join(s.text for s in self.sections)

    @property
    def pages(self) -> int | None:
        if self.page_count is not None:
            return self.page_count
        return len(self.sections) if self.type == "pdf" else None

    def iter_sections(self) -> Iterator[Section]:
        """Every section, the streamed ones read as they are asked for."""
        yield from self.sections
        if self.stream is not None:
            yield from self.stream


TEXT_SUFFIXES = {".txt", ".text", ".log", ".csv", ".rst", ".json", ".yaml", ".yml", ".ini", ".cfg"}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | MARKDOWN_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES

_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~>])")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANKS = re.compile(r"\n{3,}")
#: Words that mark definition terms and descriptions through trafilatura (which keeps
#: words but drops private-use characters); replaced right after it.
_TERM_MARK, _DESC_MARK = "lkbdefterm", "lkbdefdesc"
_MARKED = re.compile(rf"^\s*(?:[-*+]\s+)?({_TERM_MARK}|{_DESC_MARK})\s?(.*)$")
#: Words that mark where a code block (an HTML ``pre``) opens and closes, and that it is a
#: synopsis (DocBook's ``pre.synopsis``: the declaration a page documents, not an example).
_CODE_MARK, _SYNOPSIS_MARK, _CODE_END = "lkbcodeblock", "lkbsynopsisblock", "lkbcodeend"
_CODE_MARKS = re.compile(rf"(?:^[ \t]*(?:[-*+>][ \t]+)*)?({_CODE_MARK}|{_SYNOPSIS_MARK}|{_CODE_END})",
                         re.MULTILINE)
#: How a fence opens a synopsis (a fence's info string names its content's kind).
SYNOPSIS_FENCE = "```synopsis"
_PERMALINK_MARKS = {"", "¶", "#", "§", "🔗", "⚓"}
_PERMALINK_WORDS = re.compile(r"permalink|permanent link|link to this|anchor|headerlink|id_link",
                              re.IGNORECASE)
#: A permalink mark left at the end of a title or heading (``Coroutines and Tasks¶``).
_TRAILING_MARK = re.compile(r"[ \t]*[¶§🔗]+[ \t]*$", re.MULTILINE)
#: Where a line may break or a word may be hyphenated, and nothing shows (zero-width space,
#: soft hyphen, word joiner, BOM): DocBook writes ``ARRAY_&#8203;MAX_&#8203;CARDINALITY``.
_INVISIBLE = re.compile("[\u00ad\u200b\u2060\ufeff]")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
_SOURCE_BREAK = re.compile(r"[ \t\r\f]*\n\s*")
#: Where a page's own line breaks are its text (CSS ``white-space: pre``), not source layout.
_KEEPS_LINES = ("//pre | //textarea | //script | //style"
                " | //*[contains(translate(@style, ' ', ''), 'white-space:pre')]"
                " | //*[contains(translate(@style, ' ', ''), 'white-space:break-spaces')]")


def _tidy(text: str) -> str:
    """Spaces collapsed and lines trimmed, except a fenced code block's lines: their
    indentation is the code's (the model's tokenizer reads no white space, so a passage's
    size is the same either way)."""
    lines, code = [], False
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.strip().startswith("```"):
            code = not code
            lines.append(line.strip())
        else:
            lines.append(line.rstrip() if code else _SPACES.sub(" ", line).strip())
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def looks_binary(data: bytes) -> bool:
    """A NUL byte in the first 8 KiB means this is not a text file."""
    return b"\x00" in data[:8192]


def decode_text(data: bytes) -> str:
    """UTF-8 (with or without BOM), then UTF-16 by BOM, then Latin-1 as the last resort."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def extract_html(html: str | bytes, *, url: str | None = None, title: str | None = None) -> Document:
    """A web page's whole content as Markdown-ish text (headings kept for chunking).

    The page's main container (``main``, ``[role=main]``, an only ``article``, Sphinx's
    ``div.body``, ``#content``; else the body) is written out whole, in document order,
    without what is navigation by its structure (``nav``, a banner ``header`` or
    ``footer``, sidebars, search forms; ``_CHROME``). Raises ``InvalidDocument`` when no
    text is left.
    """
    if isinstance(html, bytes):
        html = decode_text(html)
    if not html.strip():
        raise InvalidDocument("the page is empty")
    tree, declared = _prepare_html(html)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            meta = _title_metadata(html)
        except Exception:
            meta = None
    content = _main_content(tree) if tree is not None else None
    text = _render(content) if content is not None else ""
    if len(text.strip()) < 20 and tree is not None:
        text = _render(tree.find("body") if tree.find("body") is not None else tree)
    text = _code_blocks(_INVISIBLE.sub("", text))
    text = _tidy(_definitions(text))
    if not text:
        raise InvalidDocument("no text could be extracted from the page")
    page_title = title or _specific_title(
        _page_title(meta.title if meta and meta.title else None, declared) or _html_title(html),
        declared, _first_heading(content))
    lang = meta.language if meta and getattr(meta, "language", None) else None
    return Document(
        title=clean_title(page_title or url or "Untitled page")[:300],
        type="html",
        sections=[Section(text)],
        url=url,
        lang=lang,
    )


def _title_metadata(html: str):
    """The title part of ``trafilatura.extract_metadata``, the same steps in the same order.

    The rest of it (author, dates through htmldate, site name, categories, licence) is
    never used here and cost a third of each page's extraction (6 % of an add of the
    Python library pages, where the model is 73 %).
    """
    from trafilatura.metadata import examine_meta, extract_meta_json, extract_title
    from trafilatura.utils import load_html

    tree = load_html(html)
    if tree is None:
        return None
    meta = examine_meta(tree)
    with contextlib.suppress(Exception):  # trafilatura logs and skips a bad JSON-LD block alike
        meta = extract_meta_json(tree, meta)
    if not meta.title:
        meta.title = extract_title(tree)
    meta.clean_and_trim()
    return meta


def clean_title(title: str) -> str:
    """A title without the permalink mark doc generators append (``¶``, ``§``, a lone ``#``)."""
    title = _TRAILING_MARK.sub("", _tidy(title))
    return re.sub(r"\s+#$", "", title).strip() or title


def _is_permalink(a) -> bool:
    """An in-page anchor that only shows a mark (Sphinx ``¶``, PostgreSQL ``#``, GitHub's icon)."""
    href = a.get("href") or ""
    if not href.startswith("#"):
        return False
    text = (a.text_content() or "").strip()
    if text in _PERMALINK_MARKS:
        return True
    hints = " ".join(a.get(k) or "" for k in ("class", "title", "aria-label"))
    return len(text) <= 2 and bool(_PERMALINK_WORDS.search(hints))


def _qualify_signature(dt) -> None:
    """Sphinx shows a method as ``done()`` under ``class asyncio.Task``; its id is the full name.

    The signature is written with that full name (``asyncio.Task.done()``), so the name a
    reader types is in the passage that defines it.
    """
    full = dt.get("id") or ""
    names = dt.xpath(".//*[contains(concat(' ', normalize-space(@class), ' '), ' descname ')]")
    if not names or "." not in full:
        return
    shown = names[0].text_content().strip()
    if not shown or not full.endswith("." + shown):
        return
    for pre in dt.xpath(".//*[contains(concat(' ', normalize-space(@class), ' '), ' descclassname ')]"):
        pre.drop_tree()
    target = names[0]
    while len(target) and not (target.text or "").strip():
        target = target[0]
    target.text = full[: -len(shown)] + (target.text or "")


@dataclass(frozen=True)
class DeclaredTitles:
    """The titles a page's author declared: its ``<title>``, its social-card titles, its h1s."""

    title: str | None = None
    others: tuple[str, ...] = ()
    #: What the page calls its site: ``og:site_name``, the text of its links home.
    sites: tuple[str, ...] = ()

    def holds(self, guess: str) -> bool:
        low = clean_title(guess).casefold()
        return any(low in clean_title(t).casefold() for t in (self.title or "", *self.others) if t)


def _declared_titles(tree) -> DeclaredTitles:
    texts = [_tidy(t.text_content()) for t in tree.xpath("//head/title | //title")[:1]]
    others = [_tidy(m.get("content") or "") for m in tree.xpath(
        "//meta[@property='og:title' or @name='og:title' or @name='twitter:title']")]
    others += [_tidy(h.text_content()) for h in tree.xpath("//h1")]
    sites = [m.get("content") or "" for m in tree.xpath(
        "//meta[@property='og:site_name' or @name='application-name']")]
    for a in tree.xpath("//a[@href]"):
        href = a.get("href").strip()
        if not href or href.startswith("#"):
            continue  # the page itself (Sphinx links the current page with ``href=""``)
        home = re.sub(r"^(?:\.\./|\./)+", "", href.split("#")[0]) in ("", "/", "index.html")
        if home or "home" in (a.get("rel") or "").split():
            sites.append(a.text_content() or " ".join(i.get("alt") or "" for i in a.iter("img")))
    return DeclaredTitles(texts[0] if texts and texts[0] else None, tuple(t for t in others if t),
                          tuple(dict.fromkeys(s for s in map(_tidy, sites) if s)))


#: A title that names a documentation site rather than a page ("KB Sample 2.1 documentation").
_SITE_TITLE = re.compile(r"\b(?:documentation|docs)$", re.IGNORECASE)
#: What separates a title's parts ("Settings — KB Sample 2.1 documentation", "A | B", "A - B").
_TITLE_PARTS = re.compile(r"\s+(?:[—–|·»]|::|-)\s+")


def _names_site(title: str, declared: DeclaredTitles) -> bool:
    low = clean_title(title).casefold()
    return bool(_SITE_TITLE.search(low)) or any(low == s.casefold() for s in declared.sites)


def _specific_title(title: str | None, declared: DeclaredTitles, heading: str | None) -> str | None:
    """A title that only names the site (as Sphinx titles many pages) gives way to the part of
    the page's ``<title>`` that names the page, else to the page's first heading.

    Decided from the page alone: a title shared by many pages of one knowledge base needs
    the store to see (DESIGN.md "Extraction").
    """
    if not title or not _names_site(title, declared):
        return title
    parts = [p for p in _TITLE_PARTS.split(declared.title or "") if p.strip()]
    specific = [p for p in parts if not _names_site(p, declared)] if len(parts) > 1 else []
    return specific[0] if specific else heading or title


def _page_title(guess: str | None, declared: DeclaredTitles) -> str | None:
    """trafilatura's title when the author declared it (in ``<title>``, a social-card title or
    an h1); otherwise the page's own ``<title>``.

    trafilatura falls back on headings with "title" in their class, and DocBook writes every
    admonition's heading that way (``<h3 class="title">Note</h3>``): 51 of the PostgreSQL
    manual's 1,168 pages came out titled Note, Tip, Caution, Warning or Important.
    """
    if guess and (declared.holds(guess) or not declared.title):
        return guess
    return declared.title or guess


#: Containers of notes, tips and warnings, as DocBook (``div.note``) and Sphinx
#: (``div.admonition``) write them.
_ADMONITIONS = "//div[" + " or ".join(
    f"contains(concat(' ', normalize-space(@class), ' '), ' {c} ')"
    for c in ("note", "tip", "hint", "warning", "caution", "important", "attention", "danger",
              "admonition")) + "]"


def _label_admonitions(tree) -> None:
    """An admonition's heading ("Note", "Tip") becomes a bold label of its own paragraph.

    It labels a box; it is not a section of the page. As a heading, trafilatura ran it
    into the box's first paragraph inside a definition (``### Tip The other locale
    settings lc_messages, …``), the chunker opened a section there and every name of the
    paragraph read as defined by it.
    """
    import lxml.html

    for box in tree.xpath(_ADMONITIONS):
        for head in box.xpath("./h1|./h2|./h3|./h4|./h5|./h6|./p[contains(@class, 'admonition-title')]"):
            label = " ".join(head.text_content().split())
            para = lxml.html.Element("p")
            strong = lxml.html.Element("strong")
            strong.text = label
            para.append(strong)
            para.tail = head.tail
            head.getparent().replace(head, para)


def _prepare_html(html: str) -> tuple[object | None, DeclaredTitles]:
    """The page parsed and made ready to write out: permalink marks dropped, Sphinx signatures
    named in full, definition terms and descriptions marked (``_definitions`` writes them
    back), code blocks marked; and the titles its author declared (read before the permalink
    marks go)."""
    import lxml.html

    try:
        tree = lxml.html.fromstring(_XML_DECLARATION.sub("", html, count=1))
    except Exception:
        return None, DeclaredTitles()
    declared = _declared_titles(tree)
    _unwrap_source_lines(tree)
    _label_admonitions(tree)
    for a in tree.xpath("//a[@href]"):
        if _is_permalink(a):
            a.drop_tree()  # keeps its tail text
    for dt in tree.xpath("//dt[@id]"):
        _qualify_signature(dt)
    _mark_code_blocks(tree)
    terms = [dt for dt in tree.xpath("//dt") if not _is_reference(dt)]
    held = set(terms)
    for el, mark in [(dt, _TERM_MARK) for dt in terms] + [
            (dd, _DESC_MARK) for dd in tree.xpath("//dd")
            if next(iter(dd.xpath("preceding-sibling::dt[1]")), None) in held]:
        el.text = f"{mark} {el.text or ''}"
    return tree, declared


def _unwrap_source_lines(tree) -> None:
    """Line breaks of the HTML source inside running text as the spaces a browser renders.

    A paragraph is one line of text however its source is wrapped. Kept as lines, the wraps
    made a name that happened to open a source line read as a line's first word: a prose
    mention (``<code>from_collapse_limit</code> (so that explicit joins…``) looked like a
    signature, a definition of the name (``ingest.chunk.defining_spans``). Only ``pre``
    (and elements styled to keep white space) keep their lines; ``br`` and block elements
    still break lines, as they do on screen.
    """
    kept = {el for block in tree.xpath(_KEEPS_LINES) for el in block.iter()}
    for el in tree.iter():
        if not isinstance(el.tag, str):
            continue  # comments and processing instructions are not text
        if el.text and "\n" in el.text and el not in kept:
            el.text = _SOURCE_BREAK.sub(" ", el.text)
        if el.tail and "\n" in el.tail and el.getparent() not in kept:
            el.tail = _SOURCE_BREAK.sub(" ", el.tail)


# -- the page written out ----------------------------------------------------------------
def _has_class(*names: str) -> str:
    return " or ".join(f"contains(concat(' ', normalize-space(@class), ' '), ' {n} ')" for n in names)


#: Where a page's content is, most specific first: a candidate counts when the page has
#: exactly one (a list of articles is no article).
_MAIN = ("//main", "//*[@role='main']", "//article",
         f"//div[{_has_class('body')}]", f"//div[{_has_class('document')}]",
         "//*[@id='content']", "//*[@id='main-content']")
#: Navigation chrome by structure: what goes wherever it is. A ``header``, ``footer`` or
#: ``aside`` is a page's banner, footer or sidebar only outside its content (an article's
#: own header holds its title; Sphinx writes footnotes and topics as ``aside``).
#: Class names of navigation chrome (Sphinx's sidebar and related bars, DocBook's navigation
#: header and footer, skip links, breadcrumbs, menus, pydata-sphinx-theme's sidebars).
_CHROME_CLASSES = ("sphinxsidebar", "related", "tagline", "navheader", "navfooter", "skip-link", "breadcrumb",
                   "breadcrumbs", "mainmenu", "submenu", "searchmenu",
                   "bd-sidebar-primary", "bd-sidebar-secondary", "prev-next-area",
                   "bd-header-article", "sidebar-drawer", "viewcode-back")
_CHROME = ("//nav | //form | //button | //script | //style | //noscript | //template"
           " | //iframe | //object | //select | //input | //textarea | //*[@hidden]"
           " | //*[@role='navigation' or @role='search' or @role='banner' or @role='contentinfo']"
           f" | //*[{_has_class(*_CHROME_CLASSES)}]")
_PAGE_CHROME = ("(//header | //footer | //aside)[not(ancestor::main or ancestor::article"
                " or ancestor::*[@role='main'])]")
_BLOCKS = frozenset("""address article aside blockquote body caption center details dialog div dl
    fieldset figcaption figure footer header hgroup html legend main p section summary""".split())
_EMPHASIS = {"em": "*", "i": "*", "var": "*", "cite": "*", "dfn": "*", "strong": "**", "b": "**",
             "code": "`", "tt": "`", "kbd": "`", "samp": "`"}
_SKIPPED = frozenset({"img", "picture", "video", "audio", "map", "area", "head", "title", "meta",
                      "link", "base"})


def _main_content(tree):
    """The page's content container, navigation chrome dropped from the whole page."""
    for el in tree.xpath(_CHROME) + tree.xpath(_PAGE_CHROME):
        if el.getparent() is not None:
            el.drop_tree()
    for path in _MAIN:
        found = tree.xpath(path)
        if len(found) == 1 and " ".join(found[0].text_content().split()):
            return found[0]
    body = tree.find("body")
    return body if body is not None else tree


def _first_heading(content) -> str | None:
    """The content's first h1, else its first h2, else its first h3."""
    for level in ("h1", "h2", "h3") if content is not None else ():
        for head in content.iter(level):
            if head.text_content().strip():
                return clean_title(head.text_content())
    return None


class _Writer:
    """Text out, with the line breaks blocks ask for between what they hold."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pending = 0  # newlines owed before the next text
        self.prefix = ""  # a list mark or definition mark owed before the next text

    def text(self, text: str) -> None:
        if not text:
            return
        if text.strip() in (_TERM_MARK, _DESC_MARK):
            self.prefix += text.strip() + " "
            return
        if self.pending:
            self.parts.append("\n" * self.pending)
            self.pending = 0
        if self.prefix:
            if not text.strip():
                return
            self.parts.append(self.prefix)
            text, self.prefix = text.lstrip(), ""
        self.parts.append(text)

    def brk(self, lines: int) -> None:
        if self.parts and not self.prefix:
            self.pending = max(self.pending, lines)

    def item(self, mark: str, lines: int = 1) -> None:
        self.brk(lines)
        self.prefix += mark

    def value(self) -> str:
        return "".join(self.parts)


def _render(root) -> str:
    out = _Writer()
    try:
        _write(root, out, in_pre=False, gap=2)
    except RecursionError:  # nested deeper than the writer recurses: the words, without markup
        words = " ".join(root.itertext())
        for mark in (_TERM_MARK, _DESC_MARK, _CODE_MARK, _SYNOPSIS_MARK, _CODE_END):
            words = words.replace(mark, " ")
        return " ".join(words.split())
    return out.value()


def _inline(el, *, in_pre: bool = False) -> str:
    """An element's content on one line (a heading, a table cell)."""
    out = _Writer()
    _write_children(el, out, in_pre=in_pre, gap=1)
    return " ".join(out.value().split())


def _write_children(el, out: _Writer, *, in_pre: bool, gap: int) -> None:
    out.text(el.text or "")
    for child in el:
        _write(child, out, in_pre=in_pre, gap=gap)
        out.text(child.tail or "")


def _write(el, out: _Writer, *, in_pre: bool, gap: int) -> None:
    tag = el.tag.lower() if isinstance(el.tag, str) else None
    if tag is None or tag in _SKIPPED:
        return
    if in_pre:  # inside code the text's own line breaks are its lines
        if tag == "br":
            out.text("\n")
        elif tag in _EMPHASIS and not (_EMPHASIS[tag] == "`" and "\n" in el.text_content()):
            _write_marked(el, out, tag)  # a placeholder in a synopsis (``*`option`*``)
        else:
            _write_children(el, out, in_pre=True, gap=gap)
        return
    if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
        text = _inline(el)
        if text:
            out.brk(2)
            out.text(f"{'#' * int(tag[1])} {text}")
            out.brk(2)
        return
    if tag == "br":
        out.brk(1)
        return
    if tag == "hr":
        out.brk(2)
        return
    if tag == "pre":
        out.brk(2)
        _write_children(el, out, in_pre=True, gap=gap)
        out.brk(2)
        return
    if tag == "table":
        _write_table(el, out)
        return
    if tag == "svg":  # a diagram's words (a syntax diagram's keywords), not its drawing
        words = [" ".join(t.text_content().split()) for t in el.iter("text")]
        out.brk(2)
        out.text(" ".join(w for w in words if w))
        out.brk(2)
        return
    if tag in ("ul", "ol", "dl", "menu"):
        out.brk(gap)
        for i, child in enumerate(c for c in el if isinstance(c.tag, str)):
            if tag != "dl" and child.tag == "li":
                out.item(f"{i + 1}. " if tag == "ol" else "- ")
                _write_children(child, out, in_pre=in_pre, gap=1)
            else:  # dt and dd: their marks are in their text (``_prepare_html``)
                out.brk(1)
                _write_children(child, out, in_pre=in_pre, gap=1)
        out.brk(gap)
        return
    if tag in _BLOCKS or tag in ("li", "dt", "dd"):
        out.brk(gap)
        _write_children(el, out, in_pre=in_pre, gap=gap)
        out.brk(gap)
        return
    if tag in _EMPHASIS:
        _write_marked(el, out, tag)
    else:
        _write_children(el, out, in_pre=in_pre, gap=gap)


def _write_marked(el, out: _Writer, tag: str) -> None:
    """Emphasis, strong text and inline code with their Markdown marks, on one line."""
    mark = _EMPHASIS[tag]
    inner = _inline(el, in_pre=True)
    if not inner:
        return
    text = el.text_content()
    lead = " " if text[:1].isspace() else ""
    trail = " " if text[-1:].isspace() else ""
    out.text(f"{lead}{mark}{inner}{mark}{trail}")


def _write_table(table, out: _Writer) -> None:
    """A table as Markdown rows, its caption a paragraph before it; a cell on one line."""
    caption = table.find("caption")
    if caption is not None:
        out.brk(2)
        out.text(_inline(caption))
    rows = [[_inline(c).replace("|", "\\|") for c in tr.xpath("./th|./td")]
            for tr in table.iter("tr") if next(tr.iterancestors("table")) is table]
    rows = [r for r in rows if any(r)]
    if not rows:
        return
    out.brk(2)
    lines = ["| " + " | ".join(rows[0]) + " |"]
    if len(rows) > 1:
        lines.append("|" + "---|" * len(rows[0]))
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    out.text("\n".join(lines))
    out.brk(2)


def _one_line(text: str | None) -> str | None:
    return " ".join(text.split()) if text and "\n" in text else text


def _mark_code_blocks(tree) -> None:
    """Every ``pre`` of the page marked where it opens and closes; a ``pre`` in a table cell
    is inline code of its row, on one line.

    trafilatura fences some ``pre`` blocks and not others, and writes an inline ``<code>``
    whose text wraps a source line as a block opened at the end of a prose line (280 of the
    PostgreSQL manual's 1,168 pages): read by its fences, what follows such a stray fence
    would be code. The page's own structure says what is code; ``_code_blocks`` writes the
    marks back as the only fences. (Inline code is on one line already: a source line break
    in running text is a space, ``_unwrap_source_lines``.)
    """
    for code in tree.xpath("//table//pre"):
        code.tag = "code"
        for node in code.iter():
            node.text = _one_line(node.text)
            if node is not code:
                node.tail = _one_line(node.tail)
    for pre in tree.xpath("//pre[not(ancestor::pre)]"):
        synopsis = "synopsis" in (pre.get("class") or "").split()
        pre.text = f"{_SYNOPSIS_MARK if synopsis else _CODE_MARK}\n{pre.text or ''}"
        if len(pre):
            pre[-1].tail = f"{pre[-1].tail or ''}\n{_CODE_END}"
        else:
            pre.text += f"\n{_CODE_END}"


def _code_blocks(text: str) -> str:
    """The code marks of ``_mark_code_blocks`` as fences (a synopsis's with its info string), and
    no other fence: the extractor's own are left out, as they mark its guesses.

    Each block stands as a paragraph of its own, so the chunker reads where it opens.
    """
    out: list[str] = []
    inside = False
    for part in _CODE_MARKS.split(text):
        if part in (_CODE_MARK, _SYNOPSIS_MARK):
            if inside:  # a block whose end the extractor lost ends where the next one opens
                out.append("\n```\n\n")
            out.append(f"\n\n{SYNOPSIS_FENCE if part == _SYNOPSIS_MARK else '```'}\n")
            inside = True
        elif part == _CODE_END:
            if inside:
                out.append("\n```\n\n")
            inside = False
        elif inside:
            lines = part.strip("\n").split("\n")
            out.append("\n".join(line for line in lines if not line.strip().startswith("```")))
        else:
            out.append(part.replace("```", ""))
    return "".join(out) + ("\n```" if inside else "")


def _is_reference(dt) -> bool:
    """A definition term that is only a link to another page (``<a class="xref"
    href="runtime-config-resource.html#…">maintenance_work_mem</a>`` in GIN's tips): the
    name is defined there, and this list only points to it, so it is no term of its own.
    (A table of contents' entries, links without a description, are left as they are.)"""
    described = dt.getnext() is not None and dt.getnext().tag == "dd"  # not a contents entry
    links = [a for a in dt.xpath(".//a[@href]") if not (a.get("href") or "").startswith("#")]
    text = " ".join(dt.text_content().split())
    return described and bool(links) and text == " ".join(" ".join(a.text_content() for a in links).split())


def _definitions(text: str) -> str:
    """Definition lists as "term" lines, then ": description" lines (the chunker keeps them together)."""
    lines = []
    for line in text.split("\n"):
        m = _MARKED.match(line)
        if m is None:
            lines.append(line.replace(_TERM_MARK, "").replace(_DESC_MARK, ""))
            continue
        body = _TRAILING_MARK.sub("", m.group(2).replace(_TERM_MARK, "").replace(_DESC_MARK, "")).strip()
        if m.group(1) == _DESC_MARK:
            lines.append(f": {body}" if body else "")
        elif body:
            lines.append(body)
    return _TRAILING_MARK.sub("", "\n".join(lines))


def _html_title(html: str) -> str | None:
    m = _TITLE.search(html)
    return _tidy(m.group(1)) if m else None


def extract_pdf(data: bytes, *, url: str | None = None, file_name: str | None = None,
                title: str | None = None) -> Document:
    """Text per page, so every chunk can name its page; a broken PDF is ``InvalidDocument``."""
    if not data.startswith(b"%PDF"):
        raise InvalidDocument("not a PDF file (no %PDF header)")
    reader, count, meta_title = _open_pdf(io.BytesIO(data))
    sections = list(_pdf_pages(reader, count))
    fallback = file_name or (url.rsplit("/", 1)[-1] if url else None) or "Untitled PDF"
    return Document(
        title=_tidy(title or meta_title or fallback)[:300],
        type="pdf",
        sections=sections,
        url=url,
        file_name=file_name,
    )


def _open_pdf(source) -> tuple[object, int, str | None]:
    """(reader, page count, metadata title) of a PDF file or stream; broken: ``InvalidDocument``."""
    import pypdf

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reader = pypdf.PdfReader(source, strict=False)
            if reader.is_encrypted:
                try:
                    reader.decrypt("")
                except Exception as err:
                    raise InvalidDocument("the PDF is encrypted") from err
            count = len(reader.pages)
            meta_title = None
            if reader.metadata is not None and reader.metadata.title:
                meta_title = str(reader.metadata.title)
    except InvalidDocument:
        raise
    except Exception as err:
        raise InvalidDocument(f"the PDF could not be read: {err}") from err
    return reader, count, meta_title


def _pdf_pages(reader, count: int, on_read: Callable[[int], None] | None = None) -> Iterator[Section]:
    """The pages with text, extracted one at a time as they are asked for."""
    found = False
    for number in range(1, count + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                page_text = _tidy(reader.pages[number - 1].extract_text() or "")
        except Exception as err:
            raise InvalidDocument(f"page {number} of the PDF could not be read: {err}") from err
        if on_read:
            on_read(1)
        if page_text:
            found = True
            yield Section(page_text, page=number)
    if not found:
        raise InvalidDocument("the PDF has no extractable text (scanned images need OCR)")


def extract_text(text: str, *, kind: str = "text", title: str | None = None,
                 url: str | None = None, file_name: str | None = None) -> Document:
    """Plain text or Markdown; the title is the first heading or line when none is given."""
    body = _tidy(text)
    if not body:
        raise EmptyDocument("the text is empty")
    if not title:
        first = body.split("\n", 1)[0]
        heading = first.lstrip("#").strip() if first.startswith("#") else ""
        title = heading[:120] or file_name or first.strip()[:120] or "Untitled note"
    return Document(title=title[:300], type=kind, sections=[Section(body)], url=url,
                    file_name=file_name)


def extract_bytes(data: bytes, *, name: str, content_type: str | None = None,
                  url: str | None = None, title: str | None = None) -> Document:
    """Pick the extractor from the content type or the file name, then sniff."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    suffix = Path(name).suffix.lower()
    file_name = None if url else Path(name).name
    from localkb.ingest import documents  # office documents, e-books, mail, gzip

    if documents.kind_of(name, ctype, data[:8]) is not None:
        return documents.extract_document(data, name=name, content_type=ctype, url=url, title=title)
    if ctype == "application/pdf" or suffix in PDF_SUFFIXES or data.startswith(b"%PDF"):
        return extract_pdf(data, url=url, file_name=file_name, title=title)
    if looks_binary(data):
        raise InvalidDocument(f"{name} is a binary file, not text")
    text = decode_text(data)
    if ctype in {"text/html", "application/xhtml+xml"} or suffix in HTML_SUFFIXES:
        doc = extract_html(text, url=url, title=title)
        doc.file_name = file_name
        return doc
    kind = "markdown" if (ctype == "text/markdown" or suffix in MARKDOWN_SUFFIXES) else "text"
    if not ctype and not suffix and text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        return extract_html(text, url=url, title=title)
    return extract_text(text, kind=kind, title=title, url=url, file_name=file_name)


# -- files read as streams ---------------------------------------------------------------
#: A text file is read in segments of about this many characters, cut at a blank line, so
#: a 30 MB file never sits in memory whole. A passage never spans two segments (as it never
#: spans two PDF pages); a file shorter than one segment reads exactly as ``extract_text``.
TEXT_SEGMENT_CHARS = 256 * 1024


def _file_encoding(path: Path) -> str:
    """UTF-16 by BOM, UTF-8 (with or without BOM) if every byte decodes, else Latin-1."""
    with open(path, "rb") as fh:
        head = fh.read(8192)
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            return "utf-16"
        if b"\x00" in head:
            raise InvalidDocument(f"{path.name} is a binary file, not text")
        decoder = codecs.getincrementaldecoder("utf-8")()
        block = head
        try:
            while block:
                decoder.decode(block)
                block = fh.read(1 << 20)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return "latin-1"
    return "utf-8-sig"


def _cut(buf: str, size: int) -> int:
    """Where a segment ends: after the first blank line (else newline) past ``size`` characters."""
    for sep in ("\n\n", "\n"):
        at = buf.find(sep, size, 2 * size)
        if at >= 0:
            return at + len(sep)
    return size


def _segments(path: Path, encoding: str, size: int) -> Iterator[tuple[str, int]]:
    """(raw text, its length) of about ``size`` characters each, cut as ``_cut`` says."""
    with open(path, encoding=encoding, newline=None) as fh:
        buf, eof = "", False
        while True:
            while not eof and len(buf) < 2 * size:
                block = fh.read(size)
                eof = not block
                buf += block
            if not buf:
                return
            cut = len(buf) if eof and len(buf) <= size else min(_cut(buf, size), len(buf))
            yield buf[:cut], cut
            buf = buf[cut:]


def open_text_file(path: Path, *, kind: str = "text", segment_chars: int = TEXT_SEGMENT_CHARS,
                   on_read: Callable[[int], None] | None = None) -> Document:
    """A text or Markdown file as a stream of segments; the title is taken from the first.

    ``on_read(chars)`` is called as each segment is handed out (for progress).
    """
    path = Path(path)
    encoding = _file_encoding(path)
    segments = _segments(path, encoding, segment_chars)
    first = ""
    for raw, n in segments:
        if on_read:
            on_read(n)
        first = _tidy(raw)
        if first:
            break
    doc = extract_text(first, kind=kind, file_name=path.name)

    def rest() -> Iterator[Section]:
        for raw, n in segments:
            if on_read:
                on_read(n)
            text = _tidy(raw)
            if text:
                yield Section(text)

    doc.stream = rest()
    return doc


def open_pdf_file(path: Path, *, on_read: Callable[[int], None] | None = None) -> Document:
    """A PDF file whose pages are extracted one by one as they are asked for.

    ``on_read(pages)`` is called as each page is handed out.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        if not fh.read(5).startswith(b"%PDF"):
            raise InvalidDocument("not a PDF file (no %PDF header)")
    reader, count, meta_title = _open_pdf(path)
    return Document(title=_tidy(meta_title or path.name)[:300], type="pdf", file_name=path.name,
                    stream=_pdf_pages(reader, count, on_read), page_count=count)


def open_file(path: Path, *, on_read: Callable[[int], None] | None = None) -> tuple[Document, str]:
    """A file as a document, streamed where its kind allows; returns (document, unit of ``on_read``).

    Text and Markdown stream by segment (``on_read`` counts characters), PDFs by page
    (``on_read`` counts pages); HTML is read whole (``on_read`` gets the byte size once).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    from localkb.ingest import documents  # office documents, e-books, mail, gzip: read whole

    if documents.kind_of(path.name) is not None:
        data = path.read_bytes()
        doc = documents.extract_document(data, name=path.name)
        if on_read:
            on_read(len(data))
        return doc, "bytes"
    with open(path, "rb") as fh:
        head = fh.read(8)
    if suffix in PDF_SUFFIXES or head.startswith(b"%PDF"):
        return open_pdf_file(path, on_read=on_read), "pages"
    if suffix in HTML_SUFFIXES:
        data = path.read_bytes()
        if looks_binary(data):
            raise InvalidDocument(f"{path.name} is a binary file, not text")
        doc = extract_html(decode_text(data), title=None)
        doc.file_name = path.name
        if on_read:
            on_read(len(data))
        return doc, "bytes"
    kind = "markdown" if suffix in MARKDOWN_SUFFIXES else "text"
    if not suffix:
        with open(path, "rb") as fh:
            start = fh.read(64).lstrip()[:15].lower()
        if start.startswith((b"<!doctype html", b"<html")):
            data = path.read_bytes()
            doc = extract_html(decode_text(data))
            doc.file_name = path.name
            if on_read:
                on_read(len(data))
            return doc, "bytes"
    return open_text_file(path, kind=kind, on_read=on_read), "chars"

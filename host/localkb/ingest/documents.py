"""Office documents, e-books, mail and compressed files as text.

    .docx  python-docx     headings (Word's Heading styles) as ``#`` lines, tables as rows
    .pptx  python-pptx     one section per slide, headed ``Slide N: title``; tables, notes
    .xlsx  openpyxl        one section per sheet, headed ``Sheet: name``; rows as a table
    .odt   lxml            headings by outline level, lists, tables
    .epub  ebooklib        one section per chapter of the spine, headed ``Chapter N: title``
    .rtf   striprtf        the text; table rows as rows
    .eml   stdlib email    subject as the title; sender, recipients, date; the body
    .gz    gzip            any readable type compressed (``page.html.gz``): read as what it holds

A section's heading leads every passage cut from it (``Section.heading``), so a passage
from the middle of a long sheet still names its sheet (and repeats the table's header row).

These files are untrusted input. A zip container is checked from its central directory
before anything inflates (member count, the total of the declared sizes), and Python's
``zipfile`` never inflates a member past its declared size (a lie ends in a CRC error), so
a zip bomb is refused with ``unsafe_document`` in bounded memory. Every XML part is read
in blocks and refused if it declares entities (billion laughs), before any library parses
it; the libraries' own parsers do not resolve entities either. A gzip stream inflates in
blocks up to the same cap.
"""

from __future__ import annotations

import io
import re
import warnings
import zipfile
from collections.abc import Iterable
from email import policy
from email.parser import BytesParser
from pathlib import Path, PurePosixPath

from localkb.errors import EmptyDocument, InvalidDocument, UnsafeDocument
from localkb.ingest.extract import (
    SUPPORTED_SUFFIXES,
    Document,
    Section,
    clean_title,
    decode_text,
    extract_html,
    extract_text,
)

#: Suffix -> kind of the formats this module reads.
DOCUMENT_SUFFIXES = {".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx", ".odt": "odt",
                     ".epub": "epub", ".rtf": "rtf", ".eml": "eml"}
#: Content types (a fetched URL, a file handed over with its type) -> kind.
DOCUMENT_TYPES = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "application/vnd.oasis.opendocument.text": "odt",
    "application/epub+zip": "epub",
    "application/rtf": "rtf", "text/rtf": "rtf",
    "message/rfc822": "eml",
    "application/gzip": "gzip", "application/x-gzip": "gzip",
}
#: The most a document may inflate to, all its parts together (a zip's declared sizes, a
#: gzip stream's output).
MAX_INFLATED_BYTES = 256 * 1000 * 1000
#: The most parts a zip container may have (a real .docx has tens, a big .epub hundreds).
MAX_MEMBERS = 20_000
_XML_PARTS = (".xml", ".rels", ".opf", ".ncx", ".xhtml", ".html", ".htm", ".svg")
#: An entity declaration as UTF-8 (or any ASCII superset) and UTF-16 write it.
_ENTITY = re.compile(b"|".join(re.escape("<!ENTITY".encode(e)) for e in ("ascii", "utf-16-le", "utf-16-be")))


def kind_of(name: str, content_type: str | None = None, head: bytes = b"") -> str | None:
    """The kind of document this module reads (``docx`` … ``gzip``), from the name, the
    content type, or the first bytes; ``None`` for anything else."""
    lower = name.lower()
    suffix = PurePosixPath(lower).suffix
    if suffix in DOCUMENT_SUFFIXES:
        return DOCUMENT_SUFFIXES[suffix]
    if suffix == ".gz":
        return "gzip" if readable(lower[:-3]) else None
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype in DOCUMENT_TYPES:
        return DOCUMENT_TYPES[ctype]
    if suffix:
        return None
    if head.startswith(b"{\\rtf"):
        return "rtf"
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    return None


def readable(name: str) -> bool:
    """Whether LocalKB reads a file of this name (text, Markdown, HTML, PDF, or a kind above)."""
    return PurePosixPath(name.lower()).suffix in SUPPORTED_SUFFIXES or kind_of(name) is not None


def readable_suffixes() -> list[str]:
    """Every suffix LocalKB reads, for help texts."""
    return [*sorted(SUPPORTED_SUFFIXES | set(DOCUMENT_SUFFIXES)), ".gz (of any of these)"]


def extract_document(data: bytes, *, name: str, content_type: str | None = None,
                     url: str | None = None, title: str | None = None) -> Document:
    """The document in ``data`` (a kind ``kind_of`` names); unreadable: ``InvalidDocument``."""
    kind = kind_of(name, content_type, data[:8])
    if kind is None:
        raise InvalidDocument(f"{name} is not a document type LocalKB reads")
    file_name = None if url else Path(name).name
    if kind == "gzip":
        return _gzip(data, name=name, url=url, title=title)
    if kind in ("rtf", "eml"):
        doc = _rtf(data, file_name or name) if kind == "rtf" else _eml(data, file_name or name)
    else:
        with _open_zip(data, kind) as zf:
            _check_xml_parts(zf)
        reader = {"docx": _docx, "pptx": _pptx, "xlsx": _xlsx, "odt": _odt, "epub": _epub}[kind]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = reader(data)
        except InvalidDocument:
            raise
        except (zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, OSError) as err:
            raise InvalidDocument(f"the {kind} file could not be read: {err}") from err
        except Exception as err:  # the libraries' own errors (lxml, openpyxl, ebooklib)
            raise InvalidDocument(f"the {kind} file could not be read: {type(err).__name__}: {err}") from err
    if not any(s.text.strip() for s in doc.sections):
        raise EmptyDocument(f"the {kind} file has no text")
    doc.type, doc.url, doc.file_name = kind, url, file_name
    fallback = file_name or (url.rsplit("/", 1)[-1] if url else None) or f"Untitled {kind}"
    doc.title = clean_title(title or doc.title or fallback)[:300]
    return doc


# -- containers ---------------------------------------------------------------------------
def _human(n: int) -> str:
    from localkb.ingest.files import human_bytes

    return human_bytes(n)


def _open_zip(data: bytes, kind: str) -> zipfile.ZipFile:
    """The zip container, checked from its central directory before anything inflates."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError) as err:
        raise InvalidDocument(f"not a valid {kind} file (not a zip archive: {err})") from err
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        zf.close()
        raise UnsafeDocument(f"the {kind} file has {len(infos):,} parts, over the limit of {MAX_MEMBERS:,}")
    total = sum(i.file_size for i in infos)
    if total > MAX_INFLATED_BYTES:
        zf.close()
        big = max(infos, key=lambda i: i.file_size)
        raise UnsafeDocument(
            f"the {kind} file would inflate to {_human(total)} ({big.filename}: {_human(big.file_size)}), "
            f"over the {_human(MAX_INFLATED_BYTES)} limit: refused as a zip bomb",
            detail={"inflated_bytes": total, "limit": MAX_INFLATED_BYTES})
    return zf


def _check_xml_parts(zf: zipfile.ZipFile) -> None:
    """Refuse a container any of whose XML parts declares entities (billion laughs).

    Each part is read in 1 MiB blocks (a little of the last one kept, so a declaration split
    between two blocks is seen), never whole; ``zipfile`` stops it at its declared size.
    """
    for info in zf.infolist():
        if not info.filename.lower().endswith(_XML_PARTS):
            continue
        tail = b""
        try:
            with zf.open(info) as fh:
                while block := fh.read(1 << 20):
                    if _ENTITY.search(tail + block):
                        raise UnsafeDocument(f"{info.filename} declares XML entities (a billion-laughs "
                                             "document is built this way): refused")
                    tail = block[-32:]
        except zipfile.BadZipFile as err:
            raise InvalidDocument(f"{info.filename} is damaged: {err}") from err


def _gzip(data: bytes, *, name: str, url: str | None, title: str | None) -> Document:
    """A compressed file read as what it holds (``notes.md.gz`` as Markdown)."""
    import zlib

    from localkb.ingest.extract import extract_bytes

    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    pending = data
    try:
        while pending:
            out += inflater.decompress(pending, 1 << 20)
            pending = inflater.unconsumed_tail
            if len(out) > MAX_INFLATED_BYTES:
                raise UnsafeDocument(f"{Path(name).name} inflates past the {_human(MAX_INFLATED_BYTES)} "
                                     "limit: refused as a gzip bomb", detail={"limit": MAX_INFLATED_BYTES})
            if inflater.eof:
                break
    except zlib.error as err:
        raise InvalidDocument(f"{Path(name).name} is not a valid gzip file: {err}") from err
    inner = name[:-3] if name.lower().endswith(".gz") else name
    if kind_of(inner, None, bytes(out[:8])) == "gzip":
        raise InvalidDocument(f"{Path(name).name}: a gzip file inside a gzip file is not read")
    doc = extract_bytes(bytes(out), name=inner, url=url, title=title)
    if not url:
        doc.file_name = Path(name).name
    return doc


# -- shared shapes ------------------------------------------------------------------------
def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if hasattr(value, "isoformat"):
        value = value.isoformat(sep=" ") if hasattr(value, "hour") else value.isoformat()
        value = value.removesuffix(" 00:00:00")
    return " ".join(str(value).split()).replace("|", "\\|")


def table_rows(rows: Iterable[Iterable]) -> list[str]:
    """Rows as Markdown table lines (the first row is the header); empty rows and trailing
    empty columns dropped."""
    cells = [[_cell(v) for v in row] for row in rows]
    cells = [r for r in cells if any(r)]
    if not cells:
        return []
    width = max(max((i + 1 for i, v in enumerate(r) if v), default=0) for r in cells)
    cells = [(r + [""] * width)[:width] for r in cells]
    lines = ["| " + " | ".join(r) + " |" for r in cells]
    return [lines[0], "|" + "---|" * width, *lines[1:]]


def _heading(level: int, text: str) -> str:
    return "#" * max(1, min(level, 6)) + " " + " ".join(text.split())


# -- readers ------------------------------------------------------------------------------
_HEADING_STYLE = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)


def _docx(data: bytes) -> Document:
    import docx
    from docx.table import Table

    d = docx.Document(io.BytesIO(data))
    lines: list[str] = []
    first_heading = None
    for block in d.iter_inner_content():
        if isinstance(block, Table):
            rows = []
            for row in block.rows:
                seen, cells = set(), []
                for c in row.cells:  # a merged cell is handed out once per column it spans
                    if id(c._tc) not in seen:
                        seen.add(id(c._tc))
                        cells.append(c.text)
                rows.append(cells)
            lines += ["", *table_rows(rows), ""]
            continue
        text = block.text.strip()
        if not text:
            continue
        style = (block.style.name if block.style is not None else "") or ""
        m = _HEADING_STYLE.match(style)
        level = int(m.group(1)) if m else (1 if style.lower() == "title" else 0)
        if level:
            first_heading = first_heading or text
            lines += ["", _heading(level, text), ""]
        else:
            lines.append(text)
    return Document(title=d.core_properties.title or first_heading or "", type="docx",
                    sections=[Section(_join(lines))])


def _shape_lines(shapes) -> list[str]:
    """Text of shapes (groups opened, tables as rows), in the slide's order."""
    lines: list[str] = []
    for shape in shapes:
        if getattr(shape, "shape_type", None) == 6 or hasattr(shape, "shapes"):  # a group
            lines += _shape_lines(shape.shapes)
        elif getattr(shape, "has_table", False):
            lines += ["", *table_rows([[c.text for c in row.cells] for row in shape.table.rows]), ""]
        elif getattr(shape, "has_text_frame", False):
            lines += [p for p in (" ".join(par.text.split()) for par in shape.text_frame.paragraphs) if p]
    return lines


def _pptx(data: bytes) -> Document:
    import pptx

    deck = pptx.Presentation(io.BytesIO(data))
    sections = []
    for number, slide in enumerate(deck.slides, start=1):
        title_shape = slide.shapes.title
        title = " ".join(title_shape.text_frame.text.split()) if title_shape is not None else ""
        shapes = [s for s in slide.shapes if title_shape is None or s.shape_id != title_shape.shape_id]
        lines = _shape_lines(shapes)
        if not title and lines and len(lines[0]) <= 120:  # no title placeholder: the first line is it
            title, lines = lines[0], lines[1:]
        if slide.has_notes_slide:
            notes = " ".join(slide.notes_slide.notes_text_frame.text.split())
            if notes:
                lines += ["", f"Notes: {notes}"]
        heading = _heading(1, f"Slide {number}: {title}" if title else f"Slide {number}")
        sections.append(Section(_join(lines) or title, page=number, heading=heading))
    first = next((s.heading.split(": ", 1)[-1] for s in sections if s.heading and ": " in s.heading), "")
    return Document(title=deck.core_properties.title or first, type="pptx",
                    sections=[s for s in sections if s.text.strip()], page_count=len(sections))


def _xlsx(data: bytes) -> Document:
    import openpyxl

    wb = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        sections = []
        for ws in wb.worksheets:
            lines = table_rows(ws.iter_rows(values_only=True))
            if not lines:
                continue
            # The sheet's name and the table's header row lead every passage of the sheet.
            heading = "\n".join([_heading(1, f"Sheet: {ws.title}"), *lines[:2]])
            sections.append(Section("\n".join(lines[2:]) or lines[0], heading=heading))
        title = wb.properties.title or ""
    finally:
        wb.close()
    return Document(title=title, type="xlsx", sections=sections)


_ODF = {"text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
        "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
        "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
        "dc": "http://purl.org/dc/elements/1.1/"}


def _safe_xml(raw: bytes):
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    return etree.fromstring(raw, parser)


def _odf_text(el) -> str:
    """An ODF element's text: ``text:s`` as spaces, tabs and line breaks kept, notes left out."""
    out = [el.text or ""]
    for child in el:
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "s":
            out.append(" " * int(child.get(f"{{{_ODF['text']}}}c", "1") or 1))
        elif tag == "tab":
            out.append("\t")
        elif tag == "line-break":
            out.append("\n")
        elif tag != "note":
            out.append(_odf_text(child))
        out.append(child.tail or "")
    return "".join(out)


def _odf_blocks(parent, lines: list[str], headings: list[str]) -> None:
    for el in parent:
        tag = el.tag.rsplit("}", 1)[-1] if isinstance(el.tag, str) else ""
        if tag == "h":
            text = " ".join(_odf_text(el).split())
            if text:
                level = int(el.get(f"{{{_ODF['text']}}}outline-level", "1") or 1)
                headings.append(text)
                lines += ["", _heading(level, text), ""]
        elif tag == "p":
            text = _odf_text(el).strip()
            if text:
                lines.append(text)
        elif tag == "list":
            for item in el:
                sub: list[str] = []
                _odf_blocks(item, sub, headings)
                lines += [f"- {s}" for s in sub if s.strip()]
        elif tag == "table":
            rows = [[" ".join(_odf_text(c).split()) for c in row.iter(f"{{{_ODF['table']}}}table-cell")]
                    for row in el.iter(f"{{{_ODF['table']}}}table-row")]
            lines += ["", *table_rows(rows), ""]
        elif tag in ("section", "text", "index-body", "list-item"):
            _odf_blocks(el, lines, headings)


def _odt(data: bytes) -> Document:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
        if "content.xml" not in names:
            raise InvalidDocument("not an OpenDocument text (no content.xml)")
        content = _safe_xml(zf.read("content.xml"))
        meta = _safe_xml(zf.read("meta.xml")) if "meta.xml" in names else None
    lines: list[str] = []
    headings: list[str] = []
    for body in content.iter(f"{{{_ODF['office']}}}text"):
        _odf_blocks(body, lines, headings)
    title = ""
    if meta is not None:
        found = meta.find(f".//{{{_ODF['dc']}}}title")
        title = (found.text or "").strip() if found is not None else ""
    return Document(title=title or (headings[0] if headings else ""), type="odt",
                    sections=[Section(_join(lines))])


def _epub(data: bytes) -> Document:
    from ebooklib import ITEM_DOCUMENT, epub

    book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
    toc: dict[str, str] = {}

    def walk(entries) -> None:
        for entry in entries:
            if isinstance(entry, tuple):
                head, children = entry
                if getattr(head, "href", None):
                    toc.setdefault(head.href.split("#")[0], head.title)
                walk(children)
            elif getattr(entry, "href", None):
                toc.setdefault(entry.href.split("#")[0], entry.title)

    walk(book.toc)
    sections = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ITEM_DOCUMENT or isinstance(item, epub.EpubNav) \
                or "nav" in (getattr(item, "properties", None) or []):
            continue  # not a chapter: an image, a style sheet, the table of contents
        try:
            chapter = extract_html(item.get_content())
        except InvalidDocument:
            continue  # a cover image or an empty page
        number = len(sections) + 1
        label = " ".join((toc.get(item.get_name()) or chapter.title or "").split())
        label = label if label.lower().startswith("chapter") else \
            f"Chapter {number}: {label}" if label else f"Chapter {number}"
        sections.append(Section(chapter.text, heading=_heading(1, label)))
    titles = book.get_metadata("DC", "title")
    return Document(title=titles[0][0] if titles else "", type="epub", sections=sections)


_RTF_ROW = re.compile(r"^(?:[^|\n]*\|)+$")


def _rtf(data: bytes, name: str) -> Document:
    from striprtf.striprtf import rtf_to_text

    if not data.lstrip().startswith(b"{\\rtf"):
        raise InvalidDocument("not an RTF file (no {\\rtf header)")
    try:
        text = rtf_to_text(data.decode("latin-1"), errors="ignore")
    except Exception as err:
        raise InvalidDocument(f"the rtf file could not be read: {err}") from err
    lines: list[str] = []
    table: list[list[str]] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if _RTF_ROW.match(line.strip()) and line.strip():  # striprtf ends each cell with "|"
            table.append(line.strip().rstrip("|").split("|"))
            continue
        if table:
            lines += ["", *table_rows(table), ""]
            table = []
        lines.append(line)
    if table:
        lines += ["", *table_rows(table)]
    return extract_text("\n".join(lines), title=None, file_name=name)


def _eml(data: bytes, name: str) -> Document:
    msg = BytesParser(policy=policy.default).parsebytes(data)
    head = [f"{k}: {' '.join(str(msg[k]).split())}" for k in ("From", "To", "Cc", "Date") if msg[k]]
    body_part = msg.get_body(preferencelist=("plain", "html"))
    body = ""
    if body_part is not None:
        try:
            content = body_part.get_content()
        except (LookupError, ValueError):  # an unknown charset: read the bytes as best we can
            content = decode_text(body_part.get_payload(decode=True) or b"")
        if body_part.get_content_subtype() == "html":
            try:
                body = extract_html(content).text
            except InvalidDocument:
                body = ""
        else:
            body = content
    attached = [p.get_filename() for p in msg.iter_attachments() if p.get_filename()]
    if attached:
        body += "\n\nAttachments: " + ", ".join(attached)
    subject = " ".join(str(msg["Subject"] or "").split())
    if not body.strip() and not subject:
        raise InvalidDocument("the message has no subject and no text")
    return extract_text("\n".join(head) + "\n\n" + body, title=subject or name, file_name=name)


def _join(lines: list[str]) -> str:
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


"""A saved page is kept whole: every heading, section, list, table and code block of its
content is in a stored passage, in document order; only navigation chrome goes.

Real pages of Debian's documentation packages (tests/data/README.md names each one's
licence), added through the real pipeline from a file on the real model and store, then
read back from the stored passages.
"""

from __future__ import annotations

import re
import shutil

from conftest import REPO
from localkb.ingest.extract import extract_html, extract_text
from localkb.ingest.pipeline import add_document, add_paths

DATA = REPO / "tests" / "data"


def stored(kb, name: str, tmp_path) -> list[str]:
    """The passages stored for the test page ``name``, added as a file, in page order."""
    path = tmp_path / name
    shutil.copyfile(DATA / name, path)
    report = add_paths(kb, [str(path)])
    assert [s.status for s in report.sources] == ["added"], report.sources
    rows = kb.catalog.db.execute("SELECT text FROM chunks WHERE kb_id = ? ORDER BY idx",
                                 (kb.id,)).fetchall()
    return [r[0] for r in rows]


def holding(passages: list[str], text: str) -> list[int]:
    return [i for i, p in enumerate(passages) if text in p]


def test_every_section_heading_of_a_reference_page_is_in_a_passage(kb, tmp_path):
    """PostgreSQL 15 manual, sql-vacuum.html: the extractor kept the first heading and the
    parameter list, and dropped the other section headings."""
    passages = stored(kb, "pgdocs-sql-vacuum.html", tmp_path)
    sections = ["Synopsis", "Description", "Parameters", "Outputs", "Notes", "Examples",
                "See Also"]
    missing = [s for s in sections if not holding(passages, f"## {s}")]
    assert not missing, f"no passage holds the headings {missing}"
    firsts = [holding(passages, f"## {s}")[0] for s in sections]
    assert firsts == sorted(firsts), "the sections are out of the page's order"


def test_every_item_a_module_page_lists_is_in_a_passage(kb, tmp_path):
    """Rust's std, std/mem/index.html: the item tables (functions, structs) of a module page."""
    passages = stored(kb, "rustdoc-std-mem-index.html", tmp_path)
    items = ["align_of_val_raw", "size_of_val_raw", "transmute", "transmute_copy", "zeroed",
             "ManuallyDrop", "Discriminant", "forget", "replace", "swap", "take"]
    missing = [n for n in items if not any(re.search(rf"\b{n}\b", p) for p in passages)]
    assert not missing, f"no passage names {missing}"
    assert not holding(passages, "Run a search"), "the search form is chrome, not content"


def test_every_entry_of_a_table_of_contents_is_in_a_passage(kb, tmp_path):
    """Python 3.11 library reference, asyncio.html: the section's contents lists."""
    passages = stored(kb, "pydocs-asyncio-toc.html", tmp_path)
    entries = ["Runners", "Coroutines and Tasks", "Streams", "Synchronization Primitives",
               "Subprocesses", "Queues", "Exceptions", "Event Loop", "Futures",
               "Transports and Protocols", "Policies", "Platform Support", "Extending",
               "Developing with asyncio"]
    missing = [e for e in entries if not holding(passages, f"- {e}")]
    assert not missing, f"no passage lists {missing}"
    assert not holding(passages, "Quick search"), "the sidebar is chrome, not content"


def test_a_declaration_alone_in_its_code_block_is_stored(kb, tmp_path):
    """SQLite's C interface, c3ref/busy_timeout.html: the prototype is the page's only code,
    and the heading sits in a block SQLite keeps out of its own search."""
    passages = stored(kb, "sqlite-c3ref-busy-timeout.html", tmp_path)
    assert holding(passages, "int sqlite3_busy_timeout(sqlite3*, int ms);"), \
        "no passage holds the declaration"
    assert holding(passages, "Set A Busy Timeout"), "no passage holds the heading"


def test_highlighted_source_keeps_every_class_with_its_indentation(kb, tmp_path):
    """A Sphinx ``_modules/`` page (viewcode's highlighted source, three exception classes)."""
    passages = stored(kb, "sphinx-modules-exceptions.html", tmp_path)
    for name in ("SampleError", "QuotaExceeded", "StaleReplica"):
        assert holding(passages, f"class {name}("), f"no passage holds class {name}"
    assert holding(passages, "\n    def __init__(self, used, limit):\n"
                             "        super().__init__("), "the code lost its indentation"
    assert not holding(passages, "[docs]"), "viewcode's back links are navigation"
    assert not holding(passages, "Quick search")


def test_a_run_of_empty_sections_keeps_every_heading(kb):
    """A module list whose sections are headings alone (Python's distutils API reference):
    the chunker carried the headings on and dropped the ones that did not fit."""
    names = [f"distutils.command.build_{i}" for i in range(40)]
    text = "# API reference\n\n" + "\n\n".join(f"## 9.{i}. `{n}` — Build step {i}"
                                               for i, n in enumerate(names))
    add_document(kb, extract_text(text, kind="markdown", title="API reference"), key="page:api")
    rows = kb.catalog.db.execute("SELECT text FROM chunks WHERE kb_id = ?", (kb.id,)).fetchall()
    missing = [n for n in names if not any(f"`{n}`" in r[0] for r in rows)]
    assert not missing, f"no passage holds {len(missing)} headings, e.g. {missing[:3]}"


def test_a_page_keeps_its_content_in_document_order_without_chrome():
    page = ("<html><head><title>Widgets</title></head><body>"
            "<header><a href='/'>Home</a> <a href='/shop'>Shop</a></header>"
            "<nav><ul><li><a href='/a'>Other page</a></li></ul></nav>"
            "<main><article><header><h1>Widgets</h1></header>"
            "<p>First paragraph.</p><h2>Sizes</h2>"
            "<table><caption>Table 1. Sizes</caption><tr><th>Size</th><th>Width</th></tr>"
            "<tr><td>small</td><td>2 cm</td></tr></table>"
            "<h2>Care</h2><ul><li>Keep dry.</li><li>Wipe clean.</li></ul></article>"
            "<aside class='footnote'><p>Footnotes are content.</p></aside></main>"
            "<footer>© Widgets Inc.</footer></body></html>")
    text = extract_html(page).text
    order = ["# Widgets", "First paragraph.", "## Sizes", "Table 1. Sizes", "| small | 2 cm |",
             "## Care", "- Keep dry.", "- Wipe clean.", "Footnotes are content."]
    assert [t for t in order if t not in text] == [], text
    assert [text.index(t) for t in order] == sorted(text.index(t) for t in order), text
    for chrome in ("Home", "Other page", "Widgets Inc."):
        assert chrome not in text, text


def _titled(head: str, body: str, chrome: str = "") -> str:
    return (f"<html><head>{head}</head><body>{chrome}<div class='body' role='main'>{body}"
            "<p>Some text about how the things of this page are set up.</p></div></body></html>")


def test_a_title_that_only_names_the_site_gives_way_to_the_page_own_heading():
    """Sphinx sites title pages with the site's name alone ("<Project> <version>
    documentation"), in ``<title>`` or the social-card title; every such page read as one."""
    h1 = "<h1>Configuration</h1>"
    cases = {
        "the social card names the site": _titled(
            "<meta property='og:title' content='KB Sample 2.1 documentation'>"
            "<title>Configuration — KB Sample 2.1 documentation</title>", h1),
        "the title names the site, with two h1": _titled(
            "<title>KB Sample 2.1 documentation</title>",
            h1 + "<p>First part.</p><h1>Second part</h1>"),
        "the title is the home link's text": _titled(
            "<title>KB Sample</title>", h1 + "<h1>Another</h1>",
            "<div class='related'><a href='../index.html'>KB Sample</a></div>"),
        "no h1, a site-name title": _titled("<title>KB Sample 2.1 documentation</title>",
                                            "<h2>Configuration</h2>"),
    }
    titles = {case: extract_html(page).title for case, page in cases.items()}
    assert titles == dict.fromkeys(cases, "Configuration")


def test_a_page_specific_title_is_kept():
    page = _titled("<title>Widgets — KB Sample 2.1 documentation</title>", "<h2>Sizes</h2>")
    assert extract_html(page).title == "Widgets"
    page = _titled("<title>KB Sample 2.1 documentation</title>", "<p>No heading at all.</p>")
    assert extract_html(page).title == "KB Sample 2.1 documentation"


def test_a_deeply_nested_page_is_text_or_an_invalid_document_never_a_crash():
    """Untrusted pages: 20,000 nested inline elements once overflowed the writer's recursion."""
    from localkb.errors import InvalidDocument

    for tag in ("em", "span", "div", "code"):
        page = f"<html><body>{f'<{tag}>' * 20000}deep words{f'</{tag}>' * 20000}</body></html>"
        try:
            text = extract_html(page).text
        except InvalidDocument:
            continue
        assert "deep words" in text, tag


def test_break_opportunities_inside_a_name_are_not_text():
    """PostgreSQL's SQL key words table writes ``ARRAY_&#8203;MAX_&#8203;CARDINALITY`` (a zero-width
    space where a line may break); kept, the name was no longer one word to search for."""
    page = ("<html><body><main><table><tr><th>Key Word</th><th>PostgreSQL</th></tr>"
            "<tr><td><code>ARRAY_&#8203;MAX_&#8203;CARDINALITY</code></td><td>reserved</td></tr>"
            "</table><p>An extra&shy;ordinary word joins&#8288;up.</p></main></body></html>")
    text = extract_html(page).text
    assert "`ARRAY_MAX_CARDINALITY`" in text, ascii(text)
    assert "extraordinary" in text and "joinsup" in text, ascii(text)

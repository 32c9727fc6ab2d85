"""Office documents, e-books, mail and gzip: each read from a real file a real tool made, found
by search with the provenance its format has; hostile ones refused in bounded memory.

LibreOffice (``soffice --headless``) makes the .docx, .odt and .rtf from an HTML page, the
.pptx from a flat OpenDocument presentation and the .xlsx from a flat spreadsheet; ebooklib
writes the .epub, the stdlib ``email`` package the .eml, ``gzip`` the .html.gz.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from email.message import EmailMessage
from pathlib import Path

import pytest

from conftest import run_cli
from hostproc import HostProcess
from localkb.config import Settings
from localkb.retrieval.search import Searcher
from localkb.store.kb import Store

SOFFICE = shutil.which("soffice") or shutil.which("libreoffice")
pytestmark = pytest.mark.skipif(SOFFICE is None, reason="LibreOffice (soffice) is not installed")

PAGE = """<html><head><meta charset="utf-8"><title>Harbour handbook</title></head><body>
<h1>Harbour handbook</h1>
<p>Welcome to the harbour.</p>
<h2>Mooring rules</h2>
<p>Boats moor at the {word} pontoon after sunset only.</p>
<table><tr><th>Berth</th><th>Fee</th></tr><tr><td>Alpha</td><td>12 crowns</td></tr>
<tr><td>Bravo</td><td>{word} fee of 15 crowns</td></tr></table>
</body></html>"""
#: The made-up word each copy of the page holds, so a search tells the copies apart.
WORDS = {"docx": "quillfeather", "odt": "ospreyvale", "rtf": "zanzibarite", "html.gz": "cobbleward"}

_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
       'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
       'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
       'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
       'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0" '
       'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"')


def _slide(title: str, body: str) -> str:
    frame = '<draw:frame presentation:class="{}" svg:x="2cm" svg:y="{}" svg:width="20cm" svg:height="4cm">'
    return (f'<draw:page draw:name="{title}">{frame.format("title", "1cm")}<draw:text-box><text:p>{title}'
            f'</text:p></draw:text-box></draw:frame>{frame.format("outline", "6cm")}<draw:text-box>'
            f'<text:p>{body}</text:p></draw:text-box></draw:frame></draw:page>')


DECK = (f'<?xml version="1.0" encoding="UTF-8"?><office:document {_NS} office:version="1.3" '
        'office:mimetype="application/vnd.oasis.opendocument.presentation"><office:body><office:presentation>'
        + _slide("Quarterly review", "Sales rose in every region.")
        + _slide("Risks", "Supply of marrowvine seeds is thin.")
        + _slide("Next steps", "Open the glimmerquay depot in spring.")
        + "</office:presentation></office:body></office:document>")


def _sheet(name: str, rows: list[list[str]]) -> str:
    cells = "".join("<table:table-row>" + "".join(
        f'<table:table-cell office:value-type="string"><text:p>{v}</text:p></table:table-cell>' for v in row)
        + "</table:table-row>" for row in rows)
    return f'<table:table table:name="{name}">{cells}</table:table>'


BOOK = (f'<?xml version="1.0" encoding="UTF-8"?><office:document {_NS} office:version="1.3" '
        'office:mimetype="application/vnd.oasis.opendocument.spreadsheet"><office:body><office:spreadsheet>'
        + _sheet("Budget", [["Item", "Cost"], ["Rope", "40"], ["Brasswick lanterns", "125"]])
        + _sheet("Staff", [["Name", "Role"], ["Ilse", "Harbour pilot for the tidewrack channel"]])
        + "</office:spreadsheet></office:body></office:document>")


def _soffice(src: Path, fmt: str, out: Path, profile: Path, infilter: str | None = None) -> Path:
    args = [SOFFICE, f"-env:UserInstallation={profile.as_uri()}", "--headless", "--convert-to", fmt]
    if infilter:
        args.append(f"--infilter={infilter}")
    subprocess.run([*args, str(src), "--outdir", str(out)], check=True, capture_output=True, timeout=180)
    made = out / (src.stem + "." + fmt.split(":", 1)[0])
    assert made.is_file(), f"soffice made no {made.name}"
    return made


def _epub(path: Path) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("harbour-tales-1")
    book.set_title("Harbour tales")
    book.set_language("en")
    chapters = []
    for n, (title, text) in enumerate([("The first tide", "The ferry left at dawn with the mail."),
                                       ("The lantern keeper", "Old Maren trimmed the wicks of the "
                                        "saltglass beacon every night.")], start=1):
        ch = epub.EpubHtml(title=title, file_name=f"ch{n}.xhtml", lang="en")
        ch.content = f"<html><body><h1>{title}</h1><p>{text}</p></body></html>"
        book.add_item(ch)
        chapters.append(ch)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    epub.write_epub(str(path), book)
    return path


def _eml(path: Path) -> Path:
    msg = EmailMessage()
    msg["Subject"] = "Dredging schedule"
    msg["From"] = "Harbour Master <master@harbour.example>"
    msg["To"] = "crew@harbour.example"
    msg["Date"] = "Tue, 03 Mar 2026 09:00:00 +0000"
    msg.set_content("The dredger works the kelpmoor basin on Thursday; keep berths 4 to 9 clear.")
    msg.add_attachment(b"%PDF-1.4 not read", maintype="application", subtype="pdf", filename="map.pdf")
    path.write_bytes(bytes(msg))
    return path


#: file -> (a query, the distinctive phrase, provenance the passage shows, its page)
EXPECT = {
    "handbook.docx": ("quillfeather pontoon mooring", "quillfeather", "## Mooring rules", None),
    "handbook.odt": ("ospreyvale pontoon mooring", "ospreyvale", "## Mooring rules", None),
    "handbook.rtf": ("zanzibarite fee", "zanzibarite", "| Bravo | zanzibarite", None),
    "deck.pptx": ("glimmerquay depot", "glimmerquay", "# Slide 3: Next steps", 3),
    "book.xlsx": ("tidewrack channel pilot", "tidewrack", "# Sheet: Staff\n| Name | Role |", None),
    "tales.epub": ("saltglass beacon wicks", "saltglass", "# Chapter 2: The lantern keeper", None),
    "schedule.eml": ("kelpmoor basin dredger", "kelpmoor", "From: Harbour Master", None),
    "page.html.gz": ("cobbleward pontoon mooring", "cobbleward", "## Mooring rules", None),
}


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    """One folder holding each format, made by the tools named above."""
    work = tmp_path_factory.mktemp("made")
    folder = work / "docs"
    folder.mkdir()
    profile = work / "lo-profile"
    (work / "deck.fodp").write_text(DECK, encoding="utf-8")
    (work / "book.fods").write_text(BOOK, encoding="utf-8")
    for fmt in ("docx:MS Word 2007 XML", "odt", "rtf"):
        kind = fmt.split(":", 1)[0]
        (work / kind).mkdir()
        page = work / kind / "handbook.html"
        page.write_text(PAGE.format(word=WORDS[kind]), encoding="utf-8")
        made = _soffice(page, fmt, work / kind, profile, infilter="HTML (StarWriter)")
        shutil.copy(made, folder / made.name)
    shutil.copy(_soffice(work / "deck.fodp", "pptx", work, profile), folder / "deck.pptx")
    shutil.copy(_soffice(work / "book.fods", "xlsx", work, profile), folder / "book.xlsx")
    _epub(folder / "tales.epub")
    _eml(folder / "schedule.eml")
    (folder / "page.html.gz").write_bytes(gzip.compress(PAGE.format(word=WORDS["html.gz"]).encode()))
    assert sorted(p.name for p in folder.iterdir()) == sorted(EXPECT)
    return folder


@pytest.fixture(scope="module")
def synced(documents, tmp_path_factory) -> Path:
    """A home whose knowledge base ``Docs`` was synced with the folder by the real CLI."""
    home = tmp_path_factory.mktemp("home")
    run_cli(["kb", "create", "Docs"], home, check=True)
    res = run_cli(["sync", "Docs", str(documents), "--json"], home)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["totals"]["by_status"]["added"] == len(EXPECT), report["summary"]
    return home


def _top(home: Path, query: str) -> dict:
    """The best hit for ``query`` in ``Docs`` of ``home`` (the real model and indexes)."""
    store = Store(Settings.from_env({"LOCALKB_HOME": str(home),
                                     "LOCALKB_MODEL_DIR": os.environ["LOCALKB_MODEL_DIR"]}))
    try:
        res = Searcher(store).search(["Docs"], query, k=3)
    finally:
        store.close()
    assert res.hits, f"no hit for {query!r}: {[s.status for s in res.statuses]}"
    return res.hits[0].to_dict()


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_each_format_synced_from_a_folder_is_found_with_its_provenance(synced, name):
    query, phrase, provenance, page = EXPECT[name]
    hit = _top(synced, query)
    assert hit["file_name"] == name, (hit["file_name"], hit["text"])
    assert phrase in hit["text"] and provenance in hit["text"], hit["text"]
    assert hit["page"] == page


def test_add_of_a_single_document_file_names_its_slide(documents, tmp_path):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    res = run_cli(["add", "Docs", str(documents / "deck.pptx"), "--json"], home)
    assert res.returncode == 0, res.stdout + res.stderr
    src = json.loads(res.stdout)["sources"][0]
    assert src["status"] == "added" and src["title"] == "Quarterly review", src
    hit = _top(home, "marrowvine seeds supply")
    assert hit["text"].startswith("# Slide 2: Risks") and hit["page"] == 2, hit


def test_the_host_reads_a_document_handed_over_as_bytes(documents, tmp_path):
    data = base64.b64encode((documents / "book.xlsx").read_bytes()).decode()
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=tmp_path / "home") as host:
        assert host.request({"id": 1, "type": "kb.create", "data": {"name": "Docs"}})["ok"]
        reply = host.request({"id": 2, "type": "source.add", "data": {
            "kb": "Docs", "file_base64": data, "file_name": "book.xlsx", "captured_by": "context-menu"}})
        assert reply["ok"], reply
        assert reply["result"]["status"] == "added" and reply["result"]["title"] == "book.xlsx"
        found = host.request({"id": 3, "type": "search",
                              "data": {"kbs": ["Docs"], "query": "Brasswick lanterns"}})
        assert found["ok"], found
        assert found["result"]["hits"][0]["text"].startswith("# Sheet: Budget\n| Item | Cost |")
        bad = host.request({"id": 4, "type": "source.add", "data": {"kb": "Docs", "file_base64": data}})
        assert not bad["ok"] and bad["error"]["code"] == "invalid_input", bad


def test_the_team_server_reads_a_document_posted_as_bytes(documents, team_db, settings, tmp_path):
    import threading

    from localkb.team.attached import attach
    from localkb.team.client import TeamClient
    from localkb.team.server import TeamAPI, TeamServer

    api = TeamAPI(team_db, settings, name="acme", max_json_bytes=2 * 1024 * 1024,
                  max_import_bytes=4 * 1024 * 1024)
    httpd = TeamServer(api, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        kb = api.system.create_kb("Handbook", privacy="device", default_access=1)
        api.directory.add_user("root", admin=True)
        token = api.directory.create_token("root")["token"]
        data = base64.b64encode((documents / "tales.epub").read_bytes()).decode()
        with TeamClient(httpd.url, token) as client:
            rep = client.add(kb.id, file_base64=data, file_name="tales.epub")
            assert rep["status"] == "added" and rep["title"] == "Harbour tales", rep
            res = client.search([kb.id], "saltglass beacon", k=3)
        assert res["hits"][0]["text"].startswith("# Chapter 2: The lantern keeper"), res["hits"][0]
        # `localkb add` to a team knowledge base sends a document's bytes and name the same way
        home = tmp_path / "root"
        attach(home, httpd.url, token)
        added = run_cli(["add", "Handbook", str(documents / "deck.pptx"), "--json"], home)
        assert added.returncode == 0, added.stdout + added.stderr
        assert json.loads(added.stdout)["sources"][0]["status"] == "added"
        with TeamClient(httpd.url, token) as client:
            res = client.search([kb.id], "glimmerquay depot", k=3)
        assert res["hits"][0]["text"].startswith("# Slide 3: Next steps"), res["hits"][0]
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- hostile files ------------------------------------------------------------------------
def _zeros_deflated(inflated: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``inflated`` zero bytes (a multiple of 16 MiB), and its CRC-32."""
    block = 16 * 1024 * 1024
    assert inflated % block == 0
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = comp.compress(bytes(block)) + comp.flush(zlib.Z_FULL_FLUSH)  # stands alone: repeatable
    crc = 0
    for _ in range(inflated // block):
        crc = zlib.crc32(bytes(block), crc)
    return piece * (inflated // block) + b"\x03\x00", crc  # an empty final block ends it


def _zip_with_bomb(base: Path, out: Path, part: str, *, inflated: int, declared: int | None = None) -> Path:
    """``base`` (a real .docx) with ``part`` (replaced or added) a deflate stream that inflates to
    ``inflated`` zero bytes; its headers declare ``declared`` (the truth by default, less for a
    lying archive). Written by hand: zipfile would deflate it all."""
    stream, crc = _zeros_deflated(inflated)
    declared = inflated if declared is None else declared
    name = part.encode()
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename != part:
                dst.writestr(info, src.read(info))
    # the extra part's local header and data go where the central directory was; then the
    # directory with one more entry, and its end record
    data = out.read_bytes()
    end = data.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", data[end + 12:end + 20])
    count = struct.unpack("<H", data[end + 10:end + 12])[0]
    central = data[cd_offset:cd_offset + cd_size]
    local_at = cd_offset
    local = struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(stream), declared,
                        len(name), 0) + name
    entry = struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, crc, len(stream), declared,
                        len(name), 0, 0, 0, 0, 0, local_at) + name
    new_cd_offset = local_at + len(local) + len(stream)
    tail = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, count + 1, count + 1, cd_size + len(entry),
                       new_cd_offset, 0)
    with open(out, "wb") as fh:
        fh.write(data[:cd_offset])
        fh.write(local)
        fh.write(stream)
        fh.write(central + entry)
        fh.write(tail)
    return out


BILLION_LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                  + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
                            for i in range(1, 10))
                  + ']><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
                  '<w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>')


def _replace_part(base: Path, out: Path, part: str, body: str) -> Path:
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, body if info.filename == part else src.read(info))
    return out


def _add_measured(home: Path, path: Path, tmp: Path) -> tuple[int, dict, int]:
    """``localkb add Docs PATH --json`` as a subprocess: its exit code, report and peak RSS in MiB."""
    env = {**os.environ, "LOCALKB_HOME": str(home)}
    with open(tmp / "out.json", "w") as out, open(tmp / "err.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "localkb", "add", "Docs", str(path), "--json"],
                                stdout=out, stderr=err, env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = (tmp / "out.json").read_text()
    assert text, (tmp / "err.txt").read_text()
    return proc.returncode, json.loads(text), usage.ru_maxrss // 1024


@pytest.mark.parametrize("kind", ["zip bomb", "lying zip bomb", "billion laughs", "gzip bomb"])
def test_a_hostile_document_is_refused_with_a_stable_code_in_bounded_memory(documents, tmp_path, kind):
    home = tmp_path / "home"
    run_cli(["kb", "create", "Docs"], home, check=True)
    base = documents / "handbook.docx"
    bad = tmp_path / ("hostile.html.gz" if kind == "gzip bomb" else "hostile.docx")
    if kind == "gzip bomb":
        stream, crc = _zeros_deflated(3 * 1024 ** 3)
        size = (3 * 1024 ** 3) % 2 ** 32
        bad.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + stream + struct.pack("<II", crc, size))
    elif kind == "billion laughs":
        _replace_part(base, bad, "word/document.xml", BILLION_LAUGHS)
    else:
        # an honest bomb is refused from its declared size; a lying one (its main part says
        # 4 KiB) stops inflating there, and the damage is found
        part = "word/media/image1.bin" if kind == "zip bomb" else "word/document.xml"
        _zip_with_bomb(base, bad, part, inflated=3 * 1024 ** 3, declared=None if kind == "zip bomb" else 4096)
    assert bad.stat().st_size < 20 * 1024 * 1024
    code, report, peak_mib = _add_measured(home, bad, tmp_path)
    src = report["sources"][0]
    assert src["status"] == "failed", src
    expected = "invalid_document" if kind == "lying zip bomb" else "unsafe_document"
    assert src["error"]["code"] == expected, src["error"]
    assert code != 0
    assert peak_mib < 1024, f"peak RSS {peak_mib} MiB reading a {bad.stat().st_size:,}-byte file"

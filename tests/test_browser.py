"""The extension in a real headless Chromium, talking to the real host over native messaging.

Set-up (see ``browser_helpers``): Debian's Chromium driven by Playwright (never a downloaded
browser), the extension loaded from a copy in tmp, the host registered in the profile's own
``NativeMessagingHosts/`` folder with a launcher that runs ``python -m localkb host`` on a
temporary data directory, and pages served by a ThreadingHTTPServer on 127.0.0.1.

Why the test copy of the extension adds ``host_permissions: ["http://127.0.0.1/*"]``: a save
started from a script has no user gesture, so Chrome gives no ``activeTab`` grant and cannot
show the optional-permission prompt; the real extension then reports ``no_access`` honestly
(``test_a_page_without_access_is_reported_as_no_access`` checks exactly that on an origin the
grant does not cover). The added permission stands in for the user clicking "Allow".

The language model is ``tests/fakellm.FakeLLM``: a real OpenAI-compatible server on loopback
that records what it received, so the privacy test reads the very bytes a cloud model got.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser_helpers import (
    WAIT_MS,
    ExtensionBrowser,
    PageServer,
    catalog_rows,
    chromium_path,
    extension_copy,
    extension_id,
    register_host,
    write_launcher,
)
from conftest import make_pdf
from fakellm import FakeLLM

pytestmark = pytest.mark.browser

if chromium_path() is None:
    pytest.skip(
        "NO CHROMIUM INSTALLED: the real-browser tests of the extension did NOT run. "
        "Install it (`apt-get install -y chromium`; .ci/run does) to run tests/test_browser.py.",
        allow_module_level=True,
    )
try:
    import playwright.sync_api  # noqa: F401
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest.skip("PLAYWRIGHT NOT INSTALLED: `pip install -e .[dev]`; the browser tests did NOT run.",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"

ERR_CODE = "ERR_7731"
FLUX_HTML = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Flux capacitor error codes</title></head>
<body><main><article>
<h1>Flux capacitor error codes</h1>
<p>This page lists the error codes the time circuits report and what each of them means for
the driver. Read it before calling the workshop.</p>
<h2>{ERR_CODE}</h2>
<p>{ERR_CODE} means the flux capacitor overheated. Let it cool for ten minutes with the ignition
off, then check that the coolant line to the capacitor housing is not kinked.</p>
<h2>ERR_1200</h2>
<p>ERR_1200 means the time circuits lost their destination date. Enter the date again on the
keypad and confirm it twice.</p>
<p>Related: <a href="/manual.pdf">the workshop manual (PDF)</a>.</p>
</article></main></body></html>
"""
PDF_PAGES = [
    "Workshop manual, page one. General safety: disconnect the plutonium chamber before any "
    "repair work on the vehicle.",
    "Page two. The turbo encabulator code ZQ-5512 means the prefamulated amulite has worn out; "
    "replace the amulite and reset the panametric fan.",
]
SECRET = "The vault combination word is PINEAPPLE-4471 and must never leave this device."
SECRET_HTML = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Private notes about the capacitor</title></head>
<body><main><article><h1>Private notes about the flux capacitor</h1>
<p>My own notes on the flux capacitor overheating: {ERR_CODE} happened twice last winter.
{SECRET}</p>
<p>The flux capacitor overheated because the garage was too warm; I moved the car.</p>
</article></main></body></html>
"""
QUESTION = f"What does {ERR_CODE} mean?"
GARAGE_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Garage opening hours</title></head>
<body><main><article><h1>Garage opening hours</h1>
<p>The garage on Hill Valley Road opens at seven in the morning on weekdays and closes at six in
the evening. On Saturdays it opens at nine and closes at one; it stays closed on Sundays.</p>
<p>Bring the service booklet and the spare key when you drop the car off for an inspection.</p>
</article></main></body></html>
"""
TOOLBAR_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Hoverboard charging guide</title></head>
<body><main><article><h1>Hoverboard charging guide</h1>
<p>Charge the hoverboard for three hours before its first ride, and never leave it charging
overnight near water. A blinking green light means the battery is balancing its cells.</p>
<p>Store it at half charge when it will not be ridden for a month or more.</p>
</article></main></body></html>
"""
OPTIONS_WIDTH = 1100  # the options page opens in a tab, not in the narrow side panel


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("browser")


@pytest.fixture(scope="module")
def pw():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def pages(tmp_module: Path) -> Iterator[PageServer]:
    pdf = make_pdf(tmp_module / "manual.pdf", PDF_PAGES).read_bytes()
    routes = {
        "/flux.html": ("text/html; charset=utf-8", FLUX_HTML.encode()),
        "/manual.pdf": ("application/pdf", pdf),
        "/private.html": ("text/html; charset=utf-8", SECRET_HTML.encode()),
        "/garage.html": ("text/html; charset=utf-8", GARAGE_HTML.encode()),
        "/toolbar.html": ("text/html; charset=utf-8", TOOLBAR_HTML.encode()),
    }
    with PageServer(routes) as server:
        yield server


@pytest.fixture(scope="module")
def home(tmp_module: Path) -> Path:
    return tmp_module / "data"


@pytest.fixture(scope="module")
def browser(pw, tmp_module: Path, home: Path) -> Iterator[ExtensionBrowser]:
    ext = extension_copy(tmp_module / "extension", host_permissions=["http://127.0.0.1/*"])
    profile = tmp_module / "profile"
    downloads = tmp_module / "downloads"
    downloads.mkdir()
    # Registered before launch, so the worker's first kb.list at install already finds the host.
    launcher = write_launcher(tmp_module / "localkb-host", home)
    register_host(profile, launcher, extension_id(json.loads((ext / "manifest.json").read_text())))
    with ExtensionBrowser(pw, ext, profile, downloads=downloads) as b:
        yield b


def _open_tab(browser: ExtensionBrowser, url: str) -> dict:
    """Open ``url`` in a tab and return the tab as the worker sees it (chrome.tabs.Tab)."""
    page = browser.context.new_page()
    page.goto(url)
    # Without a grant for the page's origin the extension cannot read a tab's url (no "tabs"
    # permission), so the newest tab stands in; the worker assigns ids in increasing order.
    return browser.worker_eval(
        "async (url) => { const tabs = await chrome.tabs.query({});"
        " return tabs.find((t) => t.url === url) ?? tabs.sort((a, b) => b.id - a.id)[0]; }", url)


def _menu_click(browser: ExtensionBrowser, info: dict, tab: dict) -> dict:
    """What a click on a context-menu item does: the worker's own onMenuClick."""
    return browser.worker_eval("([info, tab]) => localkb.onMenuClick(info, tab)", [info, tab])


def _host(browser: ExtensionBrowser, type_: str, data: dict | None = None):
    """A request to the real host through the worker's native port."""
    return browser.worker_eval("([t, d]) => localkb.host.request(t, d)", [type_, data or {}])


@pytest.fixture(scope="module")
def kbs(browser: ExtensionBrowser) -> dict:
    """Two knowledge bases: Docs may reach cloud models, Private stays on the device."""
    docs = _host(browser, "kb.create", {"name": "Docs", "privacy": "cloud"})["knowledge_base"]
    private = _host(browser, "kb.create", {"name": "Private", "privacy": "device"})["knowledge_base"]
    return {"docs": docs, "private": private}


@pytest.fixture(scope="module")
def saved(browser: ExtensionBrowser, pages: PageServer, kbs: dict) -> dict:
    """The flux page and its linked PDF saved to Docs, the private page to Private, via the menu."""
    docs, private = kbs["docs"]["id"], kbs["private"]["id"]
    flux_tab = _open_tab(browser, pages.url("/flux.html"))
    page_job = _menu_click(browser, {"menuItemId": f"save-page@{docs}"}, flux_tab)
    pdf_job = _menu_click(browser, {"menuItemId": f"save-link@{docs}", "linkUrl": pages.url("/manual.pdf")},
                          flux_tab)
    private_tab = _open_tab(browser, pages.url("/private.html"))
    private_job = _menu_click(browser, {"menuItemId": f"save-page@{private}"}, private_tab)
    return {"flux_tab": flux_tab, "page_job": page_job, "pdf_job": pdf_job, "private_job": private_job}


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeLLM]:
    """Answers with the number of the passage that explains ERR_7731, slowly enough to see it stream."""

    def reply(request: dict) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
        n = _passage_number(prompt, f"{ERR_CODE} means the flux capacitor overheated")
        if n is None:
            return "I don't know from these documents."
        return f"{ERR_CODE} means the flux capacitor overheated; let it cool for ten minutes [{n}]."

    with FakeLLM(mode="slow", delay=0.08, reply_fn=reply) as llm:
        yield llm


def _passage_number(prompt: str, needle: str) -> int | None:
    """The number of the fenced passage (chat.build_messages' BEGIN/END lines) containing ``needle``."""
    for m in re.finditer(r"<<<BEGIN PASSAGE (\d+) (\w+)>>>(.*?)<<<END PASSAGE \1 \2>>>", prompt, re.S):
        if needle in m.group(3):
            return int(m.group(1))
    return None


def _shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


# ---------------------------------------------------------------- 1. capture


def test_menu_save_of_a_page_stores_its_chunks_and_reports_counts(browser, saved, kbs, home, pages):
    job = saved["page_job"]
    assert job["state"] == "done", job
    added = job["report"]["added"]
    assert added >= 1 and job["text"] == f"{added} added", job
    assert job["capturedBy"] == "context-menu" and job["kbName"] == "Docs"
    rows = catalog_rows(home, "SELECT s.id, s.captured_by, s.chunk_count, s.title FROM sources s "
                              "WHERE s.kb_id = ? AND s.url = ?", (kbs["docs"]["id"], pages.url("/flux.html")))
    assert len(rows) == 1 and rows[0]["captured_by"] == "context-menu"
    assert rows[0]["title"] == "Flux capacitor error codes"
    chunks = catalog_rows(home, "SELECT text FROM chunks WHERE source_id = ?", (rows[0]["id"],))
    assert len(chunks) == rows[0]["chunk_count"] == added
    assert any(f"{ERR_CODE} means the flux capacitor overheated" in c["text"] for c in chunks)
    # The badge shows the tab's latest save: the linked PDF, saved from this tab after the page.
    badge = browser.worker_eval("(tabId) => chrome.action.getBadgeText({tabId})", saved["flux_tab"]["id"])
    assert badge == f"+{saved['pdf_job']['report']['added']}"
    stored = browser.worker_eval("(id) => chrome.storage.session.get(`job:${id}`)", job["id"])
    assert stored[f"job:{job['id']}"]["text"] == f"{added} added"


def test_menu_save_of_a_linked_pdf_keeps_its_pages(saved, kbs, home, pages):
    job = saved["pdf_job"]
    assert job["state"] == "done", job
    assert job["text"] == f"{job['report']['added']} added"
    rows = catalog_rows(home, "SELECT id, type, pages FROM sources WHERE kb_id = ? AND url = ?",
                        (kbs["docs"]["id"], pages.url("/manual.pdf")))
    assert len(rows) == 1 and rows[0]["pages"] == 2
    chunks = catalog_rows(home, "SELECT text, page FROM chunks WHERE source_id = ? ORDER BY idx",
                          (rows[0]["id"],))
    assert {c["page"] for c in chunks} == {1, 2}
    assert any("ZQ-5512" in c["text"] and c["page"] == 2 for c in chunks)


def test_saving_the_same_page_again_reports_unchanged(browser, saved, kbs):
    job = _menu_click(browser, {"menuItemId": f"save-page@{kbs['docs']['id']}"}, saved["flux_tab"])
    assert job["state"] == "done" and job["text"] == "unchanged", job
    badge = browser.worker_eval("(tabId) => chrome.action.getBadgeText({tabId})", saved["flux_tab"]["id"])
    assert badge == "="


def test_a_page_without_access_is_reported_as_no_access(browser, pages, kbs, home):
    # localhost is the same server, but the test grant covers 127.0.0.1 only: no grant, no read.
    url = pages.url("/flux.html").replace("127.0.0.1", "localhost") + "?unlisted"
    tab = _open_tab(browser, url)
    job = _menu_click(browser, {"menuItemId": f"save-page@{kbs['docs']['id']}"}, tab)
    assert job["state"] == "failed" and job["error"]["code"] == "no_access", job
    assert "Allow access" in job["text"]
    assert browser.worker_eval("(tabId) => chrome.action.getBadgeText({tabId})", tab["id"]) == "!"
    assert catalog_rows(home, "SELECT id FROM sources WHERE url LIKE 'http://localhost%'") == []


# ---------------------------------------------------------------- 2. side panel


def _ask(panel, question: str) -> None:
    panel.fill("#question", question)
    panel.press("#question", "Enter")


def _last_answer(panel):
    return panel.locator(".turn-assistant").last


@pytest.fixture(scope="module")
def endpoints(browser: ExtensionBrowser, fake_llm: FakeLLM) -> dict:
    """Two endpoints on the same loopback server, entered on the options page: "local" (on the
    device, the default) and "cloudy" (marked as cloud). Returns the host's config afterwards."""
    options = browser.open("options.html", width=OPTIONS_WIDTH)
    options.wait_for_selector('body[data-ready="true"]')
    options.wait_for_selector('#endpoints[data-loaded="true"]')
    for name, cloud in (("local", False), ("cloudy", True)):
        options.click("#add-endpoint")
        row = options.locator(".endpoint-row").last
        row.locator('[name="name"]').fill(name)
        row.locator('[name="base_url"]').fill(fake_llm.base_url)
        row.locator('[name="model"]').fill("fake-model")
        if cloud:
            row.locator('[name="mark_cloud"]').check()
        else:
            row.locator('[name="default_endpoint"]').check()
    options.locator('#endpoints-form [type="submit"]').click()
    options.wait_for_selector("#flash:not([hidden])")
    assert options.locator("#flash").inner_text() == "Saved 2 endpoints."
    options.close()
    config = _host(browser, "config.get")
    by_name = {e["name"]: e for e in config["endpoints"]}
    assert by_name["local"]["base_url"] == fake_llm.base_url and not by_name["local"]["mark_cloud"]
    assert by_name["cloudy"]["mark_cloud"] is True and config["default_endpoint"] == "local"
    return config


def _open_panel(browser: ExtensionBrowser):
    panel = browser.open("sidepanel.html")
    panel.wait_for_selector('body[data-ready="true"]')
    panel.click("#new-chat")
    return panel


def _needs_chat():
    from localkb.native.handlers import HANDLERS

    if "chat" not in HANDLERS:
        pytest.fail("the host has no `chat` message yet (host/localkb/answer/chat.py is being written)")


def test_panel_lists_kbs_with_privacy_and_the_save_reports(browser, saved):
    panel = _open_panel(browser)
    options = panel.locator("#kb-list .kb-option")
    options.first.wait_for()
    by_name = {o.locator(".name").inner_text(): o.locator(".pill").inner_text() for o in options.all()}
    assert by_name == {"Docs": "cloud OK", "Private": "device only"}
    assert panel.locator("#model-name").inner_text() == "No language model"
    assert panel.locator("#model-where").inner_text() == "quotes passages"
    lines = panel.locator("#jobs .job .line").all_inner_texts()
    # The four newest saves: the earlier tests' two, the private page, the linked PDF.
    assert f"Docs: {saved['pdf_job']['text']}" in lines, lines
    assert f"Private: {saved['private_job']['text']}" in lines, lines
    _shot(panel, "sidepanel-start.png")
    panel.close()


def test_extractive_answer_cites_the_saved_passage(browser, saved, pages):
    _needs_chat()
    panel = _open_panel(browser)
    _ask(panel, QUESTION)
    answer = _last_answer(panel)
    answer.locator(".answer-meta").wait_for()
    steps = answer.locator(".step[data-status='passages'] .text").all_inner_texts()
    assert any(re.fullmatch(r"Docs · \d+ passages?", s) for s in steps), steps
    assert "Quoted from your passages" in answer.locator(".answer-meta").inner_text()
    cite = answer.locator(".answer a.cite").first
    cite.click()
    card = panel.locator("#passage-card")
    assert card.is_visible()
    assert ERR_CODE in panel.locator("#passage-text").inner_text()
    facts = panel.locator("#passage-facts").inner_text()
    assert "Docs" in facts and "Flux capacitor error codes" in facts
    href = panel.locator("#passage-link").get_attribute("href")
    assert href.startswith(pages.url("/")) and "#:~:text=" in href
    panel.close()


def test_model_answer_streams_and_cites_the_saved_passage(browser, saved, fake_llm, endpoints):
    _needs_chat()
    panel = _open_panel(browser)
    panel.select_option("#endpoint", "local")
    assert panel.locator("#model-where").inner_text() == "on device"
    before = len(fake_llm.requests)
    # Every text the answer shows while it is still marked as streaming, recorded as it changes
    # (an observer, not polling, so no intermediate state can slip between two looks).
    panel.evaluate("""() => {
        window.streamed = [];
        new MutationObserver(() => {
            const a = [...document.querySelectorAll('.turn-assistant .answer')].pop();
            if (a && a.classList.contains('streaming') && a.textContent) window.streamed.push(a.textContent);
        }).observe(document.getElementById('conversation'),
                   {subtree: true, childList: true, characterData: true});
    }""")
    _ask(panel, QUESTION)
    answer = _last_answer(panel)
    answer.locator(".answer-meta").wait_for()
    assert "Answered by local" in answer.locator(".answer-meta").inner_text()
    text = answer.locator(".answer").inner_text()
    assert "means the flux capacitor overheated" in text
    streamed = panel.evaluate("() => window.streamed")
    final = fake_llm.reply_fn([r for r in fake_llm.requests if r.get("stream")][-1])  # what it sent
    partial = [t for t in streamed if final.startswith(t) and len(t) < len(final)]
    assert len(set(partial)) >= 2, streamed  # the answer grew on screen token by token
    steps = answer.locator(".step .text").all_inner_texts()
    assert any(re.fullmatch(r"Docs · \d+ passages?", s) for s in steps), steps
    # Private is searched too (an on-device model may read it); its line counts what it found.
    assert any(s.startswith("Private · ") for s in steps), steps
    assert not any(re.search(r"· 0 (weaker|passage)", s) for s in steps), steps
    _shot(panel, "sidepanel-answer.png")
    answer.locator(".answer a.cite").first.click()
    assert f"{ERR_CODE} means the flux capacitor overheated" in panel.locator("#passage-text").inner_text()
    facts = panel.locator("#passage-facts").inner_text()
    assert re.search(r"Similarity\s+0\.\d\d", facts), facts  # the cosine, not the 1.00 of a rank
    assert re.search(r"Passage\s+#\d+ of \d+", facts), facts
    assert len(fake_llm.requests) > before
    _shot(panel, "sidepanel-passage.png")
    panel.locator("#passage-card [data-close]").click()

    answer.locator(".step[data-status='passages'] button:has-text('Test this search')").first.click()
    dialog = panel.locator("#search-test")
    dialog.locator(".cutoff-line").wait_for()
    assert "cut-off 0.35" in dialog.locator("#search-test-status").inner_text()
    assert dialog.locator(".bar-row").count() >= 1
    assert dialog.locator(".bar-row[data-above='true']").count() >= 1
    assert dialog.locator(".cutoff-label").inner_text() == "cut-off 0.35"
    _shot(panel, "sidepanel-test-search.png")
    dialog.locator("[data-close]").click()

    # Private found only weaker matches, which were not given to the model; its line offers
    # to use them, and the reply is asked again in place with them.
    first = json.dumps([r for r in fake_llm.requests[before:] if r.get("stream")])
    assert "PINEAPPLE-4471" not in first
    weaker = answer.locator(".step[data-status='weaker']")
    asked = len(fake_llm.requests)
    weaker.get_by_role("button", name="Use weaker matches for this reply").click()
    panel.wait_for_selector(".turn-assistant .answer-meta:has-text('Weaker matches used')")
    assert panel.locator(".turn-assistant").count() == 1
    assert "PINEAPPLE-4471" in json.dumps(fake_llm.requests[asked:])  # on-device model: allowed
    panel.close()


def test_device_only_kb_is_skipped_for_a_cloud_model_and_never_sent(browser, saved, fake_llm, endpoints):
    _needs_chat()
    panel = _open_panel(browser)
    panel.select_option("#endpoint", "cloudy")
    assert panel.locator("#model-where").inner_text() == "cloud"
    before = len(fake_llm.requests)
    _ask(panel, QUESTION)
    answer = _last_answer(panel)
    answer.locator(".answer-meta").wait_for()
    skipped = answer.locator(".step[data-status='skipped'] .text").all_inner_texts()
    assert skipped == ["Private · skipped · device only, cloudy is a cloud model"], skipped
    assert any(re.fullmatch(r"Docs · \d+ passages?", s)
               for s in answer.locator(".step .text").all_inner_texts())
    sent = json.dumps(fake_llm.requests[before:])
    assert len(fake_llm.requests) > before and ERR_CODE in sent  # Docs' passages did go
    assert "PINEAPPLE" not in sent and "vault combination" not in sent
    panel.close()


# ---------------------------------------------------------------- 3. export and import


def test_exported_file_imports_as_a_new_kb_with_the_same_answer(browser, saved, tmp_module, endpoints):
    from localkb.native.handlers import HANDLERS

    if "kb.export" not in HANDLERS or "kb.import" not in HANDLERS:
        pytest.fail("the host has no kb.export / kb.import yet (portable/archive.py is being written)")
    options = browser.open("options.html", width=OPTIONS_WIDTH)
    options.wait_for_selector('body[data-ready="true"]')
    with options.expect_download(timeout=WAIT_MS) as info:
        options.get_by_role("button", name="Export Docs").click()
        options.locator("#ask-text-ok").click()  # no passphrase: a plain .awkb
    download = info.value
    exported = tmp_module / (download.suggested_filename or "docs.awkb")
    download.save_as(exported)
    assert exported.stat().st_size > 0
    options.locator("#import-name").fill("Docs imported")
    options.locator("#import-file").set_input_files(str(exported))
    options.locator('#import-form [type="submit"]').click()
    options.wait_for_selector("#flash:has-text('Imported Docs imported')")
    _shot(options, "options-imported.png")
    options.close()

    listed = _host(browser, "kb.list")["knowledge_bases"]
    imported = next(kb for kb in listed if kb["name"] == "Docs imported")
    result = _host(browser, "search", {"kbs": [imported["id"]], "query": QUESTION})
    assert result["hits"] and ERR_CODE in result["hits"][0]["text"]
    panel = _open_panel(browser)
    for box in panel.locator("#kb-list input[type=checkbox]").all():
        box.set_checked(box.get_attribute("value") == imported["id"])
    if panel.locator("#endpoint-wrap").is_visible():
        panel.select_option("#endpoint", "local")
    _ask(panel, QUESTION)
    answer = _last_answer(panel)
    answer.locator(".answer-meta").wait_for()
    steps = answer.locator(".step .text").all_inner_texts()
    assert any(re.fullmatch(r"Docs imported · \d+ passages?", s) for s in steps), steps
    assert "means the flux capacitor overheated" in answer.locator(".answer").inner_text()
    panel.close()


def test_encrypted_export_asks_for_the_passphrase_on_import(browser, saved, tmp_module, home):
    options = browser.open("options.html", width=OPTIONS_WIDTH)
    options.wait_for_selector('body[data-ready="true"]')
    with options.expect_download(timeout=WAIT_MS) as info:
        options.get_by_role("button", name="Export Private").click()
        options.locator("#ask-text-input").fill("correct horse battery")
        options.locator("#ask-text-ok").click()
    exported = tmp_module / "private-encrypted.awkb"
    info.value.save_as(exported)
    assert b"PINEAPPLE" not in exported.read_bytes()
    kb_count = len(catalog_rows(home, "SELECT id FROM kbs"))

    options.locator("#import-file").set_input_files(str(exported))
    options.locator('#import-form [type="submit"]').click()
    dialog = options.locator("#ask-text")
    dialog.wait_for()
    assert options.locator("#ask-text-title").inner_text() == "This file is encrypted"
    options.locator("#ask-text-input").fill("wrong passphrase")
    options.locator("#ask-text-ok").click()
    options.wait_for_selector("#ask-text-title:has-text('Wrong passphrase')")
    assert len(catalog_rows(home, "SELECT id FROM kbs")) == kb_count  # nothing half-imported
    options.locator("#ask-text-input").fill("correct horse battery")
    options.locator("#ask-text-ok").click()
    options.wait_for_selector("#flash:has-text('Imported Private')")
    flash = options.locator("#flash").inner_text()
    assert re.fullmatch(r"Imported Private \(2\): 1 source, \d+ passages?\.", flash), flash
    options.close()
    rows = catalog_rows(home, "SELECT k.privacy, c.text FROM kbs k JOIN chunks c ON c.kb_id = k.id "
                              "WHERE k.name = 'Private (2)'")
    assert rows and all(r["privacy"] == "device" for r in rows)
    assert any("PINEAPPLE-4471" in r["text"] for r in rows)


# ---------------------------------------------------------------- 4. options page and "Add this tab"


def _options_page(browser: ExtensionBrowser):
    options = browser.open("options.html", width=OPTIONS_WIDTH)
    options.wait_for_selector('body[data-ready="true"]')
    return options


def _count(n: int, word: str) -> str:
    """How the pages count things: "1 passage", "3 passages"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _listed_kb(browser: ExtensionBrowser, kb_id: str) -> dict | None:
    """The knowledge base as the host's kb.list reports it now (None once deleted)."""
    return next((kb for kb in _host(browser, "kb.list")["knowledge_bases"] if kb["id"] == kb_id), None)


@pytest.fixture(scope="module")
def scratch(browser: ExtensionBrowser, saved: dict, pages: PageServer) -> dict:
    """A knowledge base of its own for the options-page tests (renamed, emptied and deleted
    there), holding the flux page and the PDF, saved through the menu."""
    kb = _host(browser, "kb.create", {"name": "Scratch", "privacy": "device"})["knowledge_base"]
    page_job = _menu_click(browser, {"menuItemId": f"save-page@{kb['id']}"}, saved["flux_tab"])
    link = {"menuItemId": f"save-link@{kb['id']}", "linkUrl": pages.url("/manual.pdf")}
    pdf_job = _menu_click(browser, link, saved["flux_tab"])
    assert page_job["state"] == "done" and pdf_job["state"] == "done", (page_job, pdf_job)
    return kb


def test_options_page_shows_counts_renames_and_changes_privacy(browser, scratch, home):
    from playwright.sync_api import expect

    options = _options_page(browser)
    flash = options.locator("#flash")
    row = options.locator(f'#kb-table tr[data-kb="{scratch["id"]}"]')
    listed = _listed_kb(browser, scratch["id"])
    assert listed["sources"] == 2 and listed["chunks"] >= 2, listed
    cells = row.locator("td").all_inner_texts()
    assert [cells[0], cells[2], cells[3]] == ["Scratch", "2", str(listed["chunks"])], cells
    assert options.get_by_label("Privacy of Scratch").input_value() == "device"

    options.get_by_role("button", name="Rename Scratch", exact=True).click()
    assert options.locator("#ask-text-input").input_value() == "Scratch"  # starts from the old name
    options.locator("#ask-text-input").fill("Not this name")
    options.locator('#ask-text button[value="cancel"]').click()
    expect(options.locator("#ask-text")).to_be_hidden()
    assert _listed_kb(browser, scratch["id"])["name"] == "Scratch"  # cancel renames nothing

    options.get_by_role("button", name="Rename Scratch", exact=True).click()
    options.locator("#ask-text-input").fill("  Scratch notes ")
    options.locator("#ask-text-ok").click()
    expect(flash).to_have_text("Renamed to Scratch notes.", timeout=WAIT_MS)
    expect(row.locator("td").first).to_have_text("Scratch notes", timeout=WAIT_MS)
    assert _listed_kb(browser, scratch["id"])["name"] == "Scratch notes"

    options.get_by_label("Privacy of Scratch notes").select_option("cloud")
    expect(flash).to_have_text("Scratch notes is now cloud OK.", timeout=WAIT_MS)
    assert _listed_kb(browser, scratch["id"])["privacy"] == "cloud"
    stored = catalog_rows(home, "SELECT name, privacy FROM kbs WHERE id = ?", (scratch["id"],))
    assert [tuple(r) for r in stored] == [("Scratch notes", "cloud")]
    options.close()


def test_options_page_lists_sources_with_counts_and_removes_one(browser, scratch, home):
    from playwright.sync_api import expect

    options = _options_page(browser)
    row = options.locator(f'#kb-table tr[data-kb="{scratch["id"]}"]')
    before = _listed_kb(browser, scratch["id"])
    options.get_by_role("button", name="Show the sources of Scratch notes", exact=True).click()
    expect(options.locator("#sources-title")).to_have_text("Sources in Scratch notes", timeout=WAIT_MS)
    items = options.locator("#sources-list li[data-source]")
    expect(items).to_have_count(2, timeout=WAIT_MS)
    expect(options.locator("#sources-page")).to_have_text("1–2 of 2")
    listed = _host(browser, "source.list", {"kb": scratch["id"]})
    by_id = {s["id"]: s for s in listed["sources"]}
    for item in items.all():
        source = by_id[item.get_attribute("data-source")]
        assert item.locator(".title").inner_text() == source["title"]
        meta = item.locator(".meta").inner_text()
        passages = _count(source["chunks"], "passage")
        assert meta.startswith(f"{source['type']} · {passages} · context-menu · "), meta
    assert sum(s["chunks"] for s in by_id.values()) == before["chunks"]

    pdf = next(s for s in by_id.values() if s["url"].endswith("/manual.pdf"))
    page = next(s for s in by_id.values() if s["id"] != pdf["id"])
    remove = options.locator(f'#sources-list li[data-source="{pdf["id"]}"] button:text-is("Remove")')
    confirm = options.locator("#confirm")
    remove.click()
    expect(confirm).to_be_visible()
    assert options.locator("#confirm-text").inner_text() == (
        f'Remove "{pdf["title"]}" and its {_count(pdf["chunks"], "passage")} from Scratch notes?')
    assert options.locator("#confirm-ok").inner_text() == "Remove"
    options.locator('#confirm button[value="cancel"]').click()
    expect(confirm).to_be_hidden()
    assert _host(browser, "source.list", {"kb": scratch["id"]})["total"] == 2  # cancel removes nothing

    remove.click()
    options.locator("#confirm-ok").click()
    removed = f"Removed {pdf['title']} ({_count(pdf['chunks'], 'passage')})."
    expect(options.locator("#flash")).to_have_text(removed, timeout=WAIT_MS)
    expect(items).to_have_count(1, timeout=WAIT_MS)
    assert items.first.get_attribute("data-source") == page["id"]
    after = _host(browser, "source.list", {"kb": scratch["id"]})
    assert after["total"] == 1 and [s["id"] for s in after["sources"]] == [page["id"]]
    assert _listed_kb(browser, scratch["id"])["chunks"] == before["chunks"] - pdf["chunks"]
    expect(row.locator("td").nth(2)).to_have_text("1", timeout=WAIT_MS)
    expect(row.locator("td").nth(3)).to_have_text(str(page["chunks"]), timeout=WAIT_MS)
    assert catalog_rows(home, "SELECT id FROM chunks WHERE source_id = ?", (pdf["id"],)) == []
    options.close()


def test_options_page_deletes_a_kb_only_after_confirmation(browser, scratch, home):
    from playwright.sync_api import expect

    options = _options_page(browser)
    row = options.locator(f'#kb-table tr[data-kb="{scratch["id"]}"]')
    listed = _listed_kb(browser, scratch["id"])
    confirm = options.locator("#confirm")
    options.get_by_role("button", name="Delete Scratch notes", exact=True).click()
    expect(confirm).to_be_visible()
    # One source is left after the last test: the question reads "1 source", not "1 sources".
    assert listed["sources"] == 1
    assert options.locator("#confirm-text").inner_text().startswith(
        f'Delete "Scratch notes" with its 1 source and {_count(listed["chunks"], "passage")}? ')
    options.locator('#confirm button[value="cancel"]').click()
    expect(confirm).to_be_hidden()
    assert _listed_kb(browser, scratch["id"]) is not None and row.is_visible()  # cancel deletes nothing

    options.get_by_role("button", name="Delete Scratch notes", exact=True).click()
    options.locator("#confirm-ok").click()
    expect(options.locator("#flash")).to_have_text("Deleted Scratch notes.", timeout=WAIT_MS)
    expect(row).to_have_count(0, timeout=WAIT_MS)
    assert _listed_kb(browser, scratch["id"]) is None
    assert catalog_rows(home, "SELECT id FROM kbs WHERE id = ?", (scratch["id"],)) == []
    assert catalog_rows(home, "SELECT id FROM chunks WHERE kb_id = ?", (scratch["id"],)) == []
    assert catalog_rows(home, "SELECT id FROM sources WHERE kb_id = ?", (scratch["id"],)) == []
    options.close()


@pytest.fixture(scope="module")
def tabs_kb(browser: ExtensionBrowser, saved: dict) -> dict:
    """A knowledge base that only "Add this tab" saves to."""
    return _host(browser, "kb.create", {"name": "Tabs", "privacy": "device"})["knowledge_base"]


def _finished_job(panel, title: str):
    """The panel's status-list entry of a finished save of the page titled ``title``."""
    job = panel.locator('#jobs .job:is([data-state="done"], [data-state="failed"])',
                        has=panel.locator(".title", has_text=title))
    job.first.wait_for()
    return job.first


def test_side_panel_add_this_tab_saves_the_active_tab_and_shows_the_report(browser, pages, tabs_kb, home):
    panel = _open_panel(browser)
    # The real panel sits beside the active tab of its window. Here the panel page is itself a
    # tab, so the served page opens as the active tab of the panel's window, and the panel's
    # own button runs its whole path: windows.getCurrent -> worker -> that window's active tab.
    window_id = panel.evaluate("async () => (await chrome.tabs.getCurrent()).windowId")
    url = pages.url("/garage.html")
    with browser.context.expect_page() as opened:
        tab = browser.worker_eval("([url, windowId]) => chrome.tabs.create({url, windowId, active: true})",
                                  [url, window_id])
    opened.value.wait_for_load_state()
    active = browser.worker_eval("(windowId) => chrome.tabs.query({active: true, windowId})", window_id)
    assert [t["id"] for t in active] == [tab["id"]]
    panel.select_option("#add-to", tabs_kb["id"])
    panel.click("#add-tab")

    job = _finished_job(panel, "Garage opening hours")
    line = job.locator(".line").inner_text()
    match = re.fullmatch(r"Tabs: (\d+) added", line)
    assert match and job.get_attribute("data-state") == "done", line
    added = int(match.group(1))
    rows = catalog_rows(home, "SELECT id, captured_by, chunk_count, title FROM sources "
                              "WHERE kb_id = ? AND url = ?", (tabs_kb["id"], url))
    assert [(r["captured_by"], r["title"], r["chunk_count"]) for r in rows] == [
        ("side-panel", "Garage opening hours", added)]
    chunks = catalog_rows(home, "SELECT text FROM chunks WHERE source_id = ?", (rows[0]["id"],))
    assert len(chunks) == added and any("Hill Valley Road" in c["text"] for c in chunks)
    assert browser.worker_eval("(tabId) => chrome.action.getBadgeText({tabId})", tab["id"]) == f"+{added}"
    _shot(panel, "sidepanel-add-tab.png")
    panel.close()
    opened.value.close()


def test_toolbar_add_this_tab_saves_to_the_default_kb_and_reports(browser, pages, tabs_kb, home):
    from playwright.sync_api import expect

    # The default knowledge base is chosen on the options page; the toolbar saves there.
    options = _options_page(browser)
    options.get_by_role("button", name="Save to Tabs from the right-click menu", exact=True).click()
    row = options.locator(f'#kb-table tr[data-kb="{tabs_kb["id"]}"]')
    expect(row).to_have_class("default", timeout=WAIT_MS)
    options.close()
    assert browser.worker_eval("() => chrome.storage.local.get('defaultKb')")["defaultKb"] == tabs_kb["id"]

    url = pages.url("/toolbar.html")
    tab = _open_tab(browser, url)
    # "Add this tab to LocalKB" on the toolbar button's menu: the worker's own click handler.
    job = _menu_click(browser, {"menuItemId": "save-tab"}, tab)
    assert job["state"] == "done" and job["capturedBy"] == "toolbar" and job["kbName"] == "Tabs", job
    added = job["report"]["added"]
    assert added >= 1 and job["text"] == f"{added} added"
    assert browser.worker_eval("(tabId) => chrome.action.getBadgeText({tabId})", tab["id"]) == f"+{added}"
    rows = catalog_rows(home, "SELECT captured_by, chunk_count FROM sources WHERE kb_id = ? AND url = ?",
                        (tabs_kb["id"], url))
    assert [tuple(r) for r in rows] == [("toolbar", added)]
    panel = _open_panel(browser)
    line = _finished_job(panel, "Hoverboard charging guide").locator(".line").inner_text()
    assert line == f"Tabs: {added} added"
    panel.close()


# ---------------------------------------------------------------- 5. no host


def test_panel_without_a_host_shows_the_install_command(pw, tmp_path):
    ext = extension_copy(tmp_path / "extension")  # the shipped manifest, and no host registered
    with ExtensionBrowser(pw, ext, tmp_path / "profile") as b:
        panel = b.open("sidepanel.html")
        notice = panel.locator("#host-missing")
        notice.wait_for()
        assert "host is not installed" in notice.inner_text()
        assert notice.locator("code").inner_text() == "localkb install"
        assert panel.locator("#app").is_hidden()
        assert panel.locator("#model-name").inner_text() == "Not connected"
        _shot(panel, "sidepanel-no-host.png")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

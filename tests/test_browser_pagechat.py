"""The side panel as a copilot for the open tab, in a real Chromium with the real host.

"Chat with this page" and "Summarize" work on a page that was never saved (the host holds it in
memory: the store's source count does not move); its passages are cited as "This page"; a cloud
model gets its text only when the chat allows it; a selection's "Explain" lands in the panel.
Set-up as in ``test_browser.py`` (see ``browser_helpers``): served pages on 127.0.0.1, the host
registered in the profile, ``FakeLLM`` as the model (cloud-marked: ``mark_cloud``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser_helpers import (
    ExtensionBrowser,
    PageServer,
    catalog_rows,
    extension_copy,
    extension_id,
    register_host,
    skip_without_a_browser,
    write_launcher,
)
from fakellm import FakeLLM

skip_without_a_browser("the side panel's page chat")
pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CODE = "GALE-5521"
LOG_HTML = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Lighthouse keeper's log</title></head>
<body><main><article>
<h1>Lighthouse keeper's log</h1>
<p>The lamp of the north lighthouse is lit every evening half an hour before sunset and put out
at sunrise. The keeper winds the clockwork of the lens every four hours through the night.</p>
<h2>Storm procedure</h2>
<p>When a gale warning comes in, the keeper raises storm signal {CODE} on the mast, closes the
iron shutters of the lantern room and logs the barometer reading every hour until it rises.</p>
<h2>Supplies</h2>
<p>Paraffin for the lamp is delivered by boat on the first Monday of the month; the store room
holds enough for six weeks of nights.</p>
</article></main></body></html>
"""
QUESTION = "Which storm signal does the keeper raise when a gale warning comes in?"
SELECTION = "closes the iron shutters of the lantern room"


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pagechat")


@pytest.fixture(scope="module")
def home(tmp_module: Path) -> Path:
    return tmp_module / "data"


@pytest.fixture(scope="module")
def pages() -> Iterator[PageServer]:
    with PageServer({"/log.html": ("text/html; charset=utf-8", LOG_HTML.encode())}) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_module: Path, home: Path) -> Iterator[ExtensionBrowser]:
    from playwright.sync_api import sync_playwright

    ext = extension_copy(tmp_module / "extension", host_permissions=["http://127.0.0.1/*"])
    profile = tmp_module / "profile"
    launcher = write_launcher(tmp_module / "localkb-host", home)
    register_host(profile, launcher, extension_id(json.loads((ext / "manifest.json").read_text())))
    with sync_playwright() as pw, ExtensionBrowser(pw, ext, profile) as b:
        yield b


def _host(browser: ExtensionBrowser, type_: str, data: dict | None = None):
    return browser.worker_eval("([t, d]) => localkb.host.request(t, d)", [type_, data or {}])


@pytest.fixture(scope="module")
def notes(browser: ExtensionBrowser) -> dict:
    """One knowledge base, device only and empty: the page is what answers."""
    return _host(browser, "kb.create", {"name": "Notes", "privacy": "device"})["knowledge_base"]


def _sources(home: Path) -> int:
    if not (home / "catalog.sqlite").exists():
        return 0  # no store yet: nothing written
    return catalog_rows(home, "SELECT count(*) AS n FROM sources")[0]["n"]


def _reply(request: dict) -> str:
    prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    for m in re.finditer(r"<<<BEGIN PASSAGE (\d+) (\w+)>>>(.*?)<<<END PASSAGE \1 \2>>>", prompt, re.S):
        if CODE in m.group(3):
            return f"The keeper raises storm signal {CODE} [{m.group(1)}]."
    return "I don't know from these documents."


@pytest.fixture(scope="module")
def cloud_llm() -> Iterator[FakeLLM]:
    with FakeLLM(reply_fn=_reply) as llm:
        yield llm


def _panel_beside(browser: ExtensionBrowser, pages: PageServer, *, width: int = 400):
    """The panel, with the served page as the active tab of the panel's window (as in the
    "Add this tab" test: here the panel page is itself a tab)."""
    panel = browser.open("sidepanel.html", width=width, height=860)
    panel.wait_for_selector('body[data-ready="true"]')
    panel.click("#new-chat")
    window_id = panel.evaluate("async () => (await chrome.tabs.getCurrent()).windowId")
    with browser.context.expect_page() as opened:
        tab = browser.worker_eval("([url, windowId]) => chrome.tabs.create({url, windowId, active: true})",
                                  [pages.url("/log.html"), window_id])
    opened.value.wait_for_load_state()
    return panel, tab, opened.value


def _attach(panel) -> None:
    panel.click("#page-chat")
    panel.wait_for_selector('body[data-page="ready"]')


def _ask(panel, question: str):
    """Ask, and wait for this question's own answer (the panel first makes sure of the page)."""
    before = panel.locator(".turn-assistant").count()
    panel.fill("#question", question)
    panel.press("#question", "Enter")
    answer = panel.locator(".turn-assistant").nth(before)
    answer.locator(".answer-meta span").first.wait_for()
    return answer


def _open_steps(answer) -> list[str]:
    details = answer.locator("details.diag")
    if details.get_attribute("open") is None:
        details.locator("summary").click()
    return answer.locator(".step .text").all_inner_texts()


def _shots(panel, name: str) -> list[Path]:
    """The panel as it is, at 320 and 400 px, light and dark."""
    ARTIFACTS.mkdir(exist_ok=True)
    out = []
    for scheme in ("light", "dark"):
        panel.emulate_media(color_scheme=scheme)
        for width in (320, 400):
            panel.set_viewport_size({"width": width, "height": 860})
            wide = panel.evaluate("() => document.documentElement.scrollWidth - innerWidth")
            assert wide <= 0, (name, scheme, width, wide)
            path = ARTIFACTS / f"pagechat-{name}-{width}-{scheme}.png"
            panel.screenshot(path=str(path))
            out.append(path)
    panel.emulate_media(color_scheme="light")
    panel.set_viewport_size({"width": 400, "height": 860})
    return out


def test_chat_with_an_unsaved_page_cites_this_page_and_stores_nothing(browser, pages, notes, home):
    before = _sources(home)
    panel, _tab, page_tab = _panel_beside(browser, pages)
    _attach(panel)
    progress = panel.locator("#page-progress").inner_text()
    assert re.fullmatch(r"This page: \d+ passages?, all searchable", progress), progress
    answer = _ask(panel, QUESTION)
    steps = _open_steps(answer)
    assert any(re.fullmatch(r"This page · \d+ passages?", s) for s in steps), steps
    assert any(s.startswith("Notes · ") for s in steps), steps  # searched beside the chosen KB
    assert CODE in answer.locator(".answer").inner_text()
    answer.locator(".answer a.cite").first.click()
    assert CODE in panel.locator("#passage-text").inner_text()
    assert "This page" in panel.locator("#passage-facts").inner_text()
    href = panel.locator("#passage-link").get_attribute("href")
    assert href.startswith(pages.url("/log.html")) and "#:~:text=" in href, href
    panel.locator("#passage-card [data-close]").click()
    answer.get_by_role("button", name="Test this search in This page").click()
    dialog = panel.locator("#search-test")
    dialog.locator(".cutoff-line").wait_for()
    assert re.fullmatch(r"This page · \d+ passages?", dialog.locator("#search-test-status").inner_text())
    dialog.locator("[data-close]").click()
    _shots(panel, "answer")
    assert _sources(home) == before  # held in the host's memory only

    # "Save" makes it a real source of the knowledge base chosen in the save bar.
    panel.select_option("#add-to", notes["id"])
    panel.click("#page-save")
    panel.wait_for_selector("#page-saved:not([hidden])")
    assert re.fullmatch(r"Notes: \d+ passages? added", panel.locator("#page-saved").inner_text())
    assert [r["title"] for r in catalog_rows(home, "SELECT title FROM sources WHERE kb_id = ?",
                                             (notes["id"],))] == ["Lighthouse keeper's log"]
    panel.close()
    page_tab.close()


def test_summarize_without_a_model_is_a_labelled_extractive_summary_with_citations(browser, pages, home):
    before = _sources(home)
    panel, _tab, page_tab = _panel_beside(browser, pages)
    panel.click("#page-summarize")
    answer = panel.locator(".turn-assistant").last
    answer.locator(".answer-meta span").first.wait_for()
    assert answer.locator(".answer-meta").inner_text().startswith("Extractive summary (no model)")
    assert answer.locator(".answer").inner_text().startswith("Extractive summary (no model)")
    assert answer.locator(".answer a.cite").count() >= 1
    assert all(t.startswith("[") for t in answer.locator(".sources button").all_inner_texts())
    answer.locator(".answer a.cite").first.click()
    assert "This page" in panel.locator("#passage-facts").inner_text()
    panel.locator("#passage-card [data-close]").click()
    _shots(panel, "summary")
    panel.evaluate("() => { document.querySelector('.turn-assistant').dataset.old = 'yes'; }")
    answer.get_by_role("button", name="Ask this question again").click()  # Regenerate
    panel.wait_for_selector(".turn-assistant:not([data-old]) .answer-meta span")
    assert panel.locator(".turn-assistant").count() == 1
    meta = panel.locator(".turn-assistant .answer-meta").inner_text()
    assert meta.startswith("Extractive summary (no model)"), meta
    assert _sources(home) == before
    panel.close()
    page_tab.close()


def test_explain_on_a_selection_lands_in_the_panel_with_the_selection_as_context(browser, pages, notes):
    panel, tab, page_tab = _panel_beside(browser, pages)
    browser.worker_eval("([info, tab]) => localkb.onMenuClick(info, tab)",
                        [{"menuItemId": "ask-explain", "selectionText": SELECTION,
                          "pageUrl": pages.url("/log.html")}, tab])
    question = panel.locator(".turn-user .bubble").last
    question.wait_for()
    assert question.inner_text() == f"Explain this passage from the page: “{SELECTION}”"
    answer = panel.locator(".turn-assistant").last
    answer.locator(".answer-meta span").first.wait_for()
    assert any(re.fullmatch(r"This page · \d+ passages?", s) for s in _open_steps(answer))
    assert "iron shutters" in answer.locator(".answer").inner_text()
    assert panel.locator('body[data-page="ready"]').count() == 1  # the page stays attached
    _shots(panel, "explain")
    panel.close()
    page_tab.close()


def test_a_cloud_model_gets_the_page_only_when_this_chat_allows_it(browser, pages, notes, cloud_llm, home):
    _host(browser, "config.set", {"endpoints": [{"name": "cloudy", "base_url": cloud_llm.base_url,
                                                 "model": "fake-model", "mark_cloud": True}],
                                  "default_endpoint": "cloudy"})
    before = _sources(home)
    panel, _tab, page_tab = _panel_beside(browser, pages)
    panel.select_option("#endpoint", "cloudy")
    _attach(panel)
    allowance = panel.locator("#page-cloud-wrap")
    assert allowance.is_visible() and allowance.inner_text() == "Allow this page's text to reach cloudy"
    answer = _ask(panel, QUESTION)
    skipped = answer.locator(".step-alerts .step[data-status='skipped'] .text").all_inner_texts()
    assert "This page · skipped · device only, cloudy is a cloud model" in skipped, skipped
    assert CODE not in json.dumps(cloud_llm.requests) and "lantern" not in json.dumps(cloud_llm.requests)
    _shots(panel, "cloud-skipped")

    panel.check("#page-cloud")
    asked = len(cloud_llm.requests)
    answer = _ask(panel, QUESTION + " ")
    assert CODE in json.dumps(cloud_llm.requests[asked:])
    assert "Answered by cloudy" in answer.locator(".answer-meta").inner_text()
    assert CODE in answer.locator(".answer").inner_text()
    assert any(re.fullmatch(r"This page · \d+ passages?", s) for s in _open_steps(answer))
    _shots(panel, "cloud-allowed")
    # A new chat starts without the allowance.
    panel.click("#new-chat")
    assert not panel.locator("#page-cloud").is_checked()
    assert _sources(home) == before
    panel.close()
    page_tab.close()

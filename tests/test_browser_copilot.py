"""The side panel as a browser copilot (issue 39, items 3 and 4), in the real Chromium.

Files dropped on the panel (a ``DataTransfer`` of real bytes dispatched as the browser would)
or chosen with "Add files…" (``set_input_files``) become one save job each, through the
service worker and the real host; and a model endpoint is set up from a preset on the options
page, tested by the host against ``tests/fakellm.FakeLLM`` (a real loopback server), and then
answers in the panel. See ``test_browser`` for how the browser and the host are set up.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest

from browser_helpers import (
    ExtensionBrowser,
    browser_with_host,
    catalog_rows,
    host_request,
    skip_without_a_browser,
)
from conftest import make_pdf
from fakellm import FakeLLM

pytestmark = pytest.mark.browser
skip_without_a_browser("the copilot browser tests (dropped files, endpoint set-up)")

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
WIDTHS = (320, 400, 600)
SCHEMES = ("light", "dark")
HTML = (b"<!doctype html><html lang='en'><head><title>Kettle care</title></head><body><main>"
        b"<h1>Kettle care</h1><p>Descale the kettle every month with citric acid; rinse it twice "
        b"before the next boil.</p></main></body></html>")
MARKDOWN = (b"# Bike notes\n\nPump the tyres of the touring bike to 4.5 bar before a long ride, "
            b"and check the chain for stretch every 2000 km.\n")
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00" * 8
DEAD_URL = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("copilot")


@pytest.fixture(scope="module")
def home(tmp_module: Path) -> Path:
    return tmp_module / "data"


@pytest.fixture(scope="module")
def browser(tmp_module: Path, home: Path) -> Iterator[ExtensionBrowser]:
    with browser_with_host(tmp_module, home) as b:
        yield b


_host = host_request


@pytest.fixture(scope="module")
def drops_kb(browser: ExtensionBrowser) -> dict:
    _host(browser, "kb.create", {"name": "Inbox", "privacy": "device"})  # the default, not chosen
    return _host(browser, "kb.create", {"name": "Household", "privacy": "device"})["knowledge_base"]


@pytest.fixture(scope="module")
def files(tmp_module: Path) -> dict[str, tuple[str, bytes]]:
    pdf = make_pdf(tmp_module / "boiler-manual.pdf", [
        "Boiler manual. The boiler pressure must stay between 1.2 and 2.5 bar when cold.",
        "Bleed every radiator each autumn, starting with the one nearest the boiler."]).read_bytes()
    mail = EmailMessage()  # an e-mail: one of the document formats the host reads (README Formats)
    mail["Subject"] = "Chimney sweep visit"
    mail["From"] = "Sweep <sweep@example.org>"
    mail.set_content("The chimney sweep comes on the second Friday of October; clear the hearth first.")
    return {"boiler-manual.pdf": ("application/pdf", pdf), "kettle.html": ("text/html", HTML),
            "bike-notes.md": ("text/markdown", MARKDOWN), "sweep.eml": ("message/rfc822", bytes(mail)),
            "diagram.png": ("image/png", PNG)}


def _open_panel(browser: ExtensionBrowser, width: int = 400):
    panel = browser.open("sidepanel.html", width=width, height=800)
    panel.wait_for_selector('body[data-ready="true"]')
    return panel


def _drag_files(panel, chosen: dict[str, tuple[str, bytes]], *, drop: bool = True) -> dict:
    """Drag real files over the panel as the browser does (dragenter, dragover, then drop)."""
    payload = [{"name": n, "type": t, "b64": base64.b64encode(b).decode()} for n, (t, b) in chosen.items()]
    return panel.evaluate("""([files, drop]) => {
        const dt = new DataTransfer();
        for (const f of files) {
            const bytes = Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0));
            dt.items.add(new File([bytes], f.name, {type: f.type}));
        }
        const over = document.getElementById('conversation');
        const fire = (type) => over.dispatchEvent(
            new DragEvent(type, {bubbles: true, cancelable: true, dataTransfer: dt}));
        fire('dragenter');
        const accepted = !fire('dragover');  // default prevented: the panel takes the drop
        const target = document.getElementById('drop-target');
        const shown = {visible: !target.hidden, text: target.textContent, accepted};
        if (drop) fire('drop');
        return {...shown, hiddenAfter: target.hidden};
    }""", [payload, drop])


def _jobs(panel, names: list[str]) -> dict[str, dict]:
    """The Saves list's finished entries for these files: state and line."""
    if panel.locator("#saves-panel").is_hidden():
        panel.click("#saves-toggle")
    out = {}
    for name in names:
        job = panel.locator('#jobs .job:is([data-state="done"], [data-state="failed"])',
                            has=panel.locator(".title", has_text=name)).first
        job.wait_for()
        out[name] = {"state": job.get_attribute("data-state"), "line": job.locator(".line").inner_text()}
    return out


def _ask_anew(panel, question: str):
    """Ask in a new chat; the finished answer."""
    panel.click("#new-chat")
    panel.fill("#question", question)
    panel.press("#question", "Enter")
    answer = panel.locator(".turn-assistant").last
    answer.locator(".answer-meta").wait_for()
    return answer


def _shots(page, name: str, *, height: int = 800, scope: str = "body") -> None:
    """The current state at every width, light and dark: nothing in ``scope`` sticks out sideways
    (the options page's knowledge-base table, not part of this, is wider than 320 px)."""
    ARTIFACTS.mkdir(exist_ok=True)
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": height})
            wide = page.evaluate("""(scope) => [...document.querySelectorAll(scope + ' *')].filter((n) => {
                const r = n.getBoundingClientRect();
                return r.width && r.right > innerWidth + 0.5 && !n.closest('[hidden]');
            }).map((n) => `${n.tagName}#${n.id}.${n.className}`)""",
                                 scope)
            assert not wide, (name, width, scheme, wide[:8])
            path = str(ARTIFACTS / f"{name}-{width}-{scheme}.png")
            if scope == "body":
                page.screenshot(path=path)
            else:
                page.locator(scope).screenshot(path=path)
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 400, "height": height})


# ---------------------------------------------------------------- 3. files dropped on the panel


def test_dropped_and_chosen_files_are_added_with_reports_and_answer_with_a_citation(
        browser, drops_kb, files, home):
    panel = _open_panel(browser)
    panel.select_option("#add-to", drops_kb["id"])
    # The drop target appears while files are over the panel and names where they go.
    shown = _drag_files(panel, {k: files[k] for k in ("boiler-manual.pdf", "kettle.html")}, drop=False)
    assert shown == {"visible": True, "text": "Drop files to add them to Household", "accepted": True,
                     "hiddenAfter": False}, shown
    _shots(panel, "panel-drop-target")
    panel.evaluate("() => document.dispatchEvent(new DragEvent('dragleave', {bubbles: true}))")
    assert panel.locator("#drop-target").is_hidden()
    dropped = _drag_files(panel, {k: files[k] for k in ("boiler-manual.pdf", "kettle.html", "sweep.eml")})
    assert dropped["hiddenAfter"] is True, dropped
    # The keyboard's way: "Add files…" opens a file input.
    with panel.expect_file_chooser() as chooser:
        panel.click("#add-files")
    chooser.value.set_files([{"name": "bike-notes.md", "mimeType": "text/markdown", "buffer": MARKDOWN}])

    jobs = _jobs(panel, ["boiler-manual.pdf", "kettle.html", "sweep.eml", "bike-notes.md"])
    for name, job in jobs.items():
        assert job["state"] == "done", (name, jobs)
        assert re.fullmatch(r"Household: \d+ passages? added", job["line"]), (name, jobs)
    rows = catalog_rows(home, "SELECT file_name, captured_by, chunk_count FROM sources WHERE kb_id = ? "
                              "ORDER BY file_name", (drops_kb["id"],))
    assert [(r["file_name"], r["captured_by"]) for r in rows] == [
        ("bike-notes.md", "side-panel"), ("boiler-manual.pdf", "side-panel"), ("kettle.html", "side-panel"),
        ("sweep.eml", "side-panel")]
    counts = {r["file_name"]: r["chunk_count"] for r in rows}
    for name, job in jobs.items():
        assert job["line"] == f"Household: {counts[name]} passage{'' if counts[name] == 1 else 's'} added"
    status = panel.locator("#save-status").inner_text()
    # The save line: the newest file's report and its name (the Saves list has them all).
    names = "|".join(re.escape(n) for n in jobs)
    assert re.fullmatch(rf"Household: \d+ passages? added · ({names})", status), status
    _shots(panel, "panel-dropped-files")

    # A question answers from them, with a citation of the dropped file.
    answer = _ask_anew(panel, "What pressure should the touring bike tyres have before a long ride?")
    assert "4.5 bar" in answer.locator(".answer").inner_text()
    answer.locator(".answer a.cite").first.click()
    panel.locator("#passage-card").wait_for()
    assert "4.5 bar" in panel.locator("#passage-text").inner_text()
    facts = panel.locator("#passage-facts").inner_text()
    assert "Household" in facts and "Bike notes" in facts, facts
    panel.close()


def test_a_file_the_host_cannot_read_is_refused_with_its_reason(browser, drops_kb, files, home):
    panel = _open_panel(browser)
    panel.select_option("#add-to", drops_kb["id"])
    _drag_files(panel, {"diagram.png": files["diagram.png"]})
    job = _jobs(panel, ["diagram.png"])["diagram.png"]
    assert job == {"state": "failed", "line": "Not saved: diagram.png is a binary file, not text"}, job
    assert catalog_rows(home, "SELECT id FROM sources WHERE file_name = 'diagram.png'") == []
    assert "failed" in panel.locator("#save-status").get_attribute("data-kind")
    _shots(panel, "panel-refused-file")
    panel.close()


# ---------------------------------------------------------------- 4. endpoint set-up


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM(reply="The tyres want 4.5 bar before a long ride [1].") as llm:
        yield llm


def _setup_from_panel(browser: ExtensionBrowser):
    """The panel's "No model" state links to the options page, where a row waits to be filled."""
    panel = _open_panel(browser)
    assert panel.locator("#model-name").inner_text() == "No model"
    link = panel.locator("#setup-model")
    assert link.is_visible() and link.inner_text() == "Set up a model"
    with browser.context.expect_page() as opened:
        link.click()
    options = opened.value
    options.set_viewport_size({"width": 600, "height": 900})
    options.wait_for_selector('#endpoints[data-loaded="true"]')
    return panel, options, options.locator(".endpoint-row").last


def test_a_dead_endpoint_test_says_why_and_saves_nothing(browser, drops_kb):
    panel, options, row = _setup_from_panel(browser)
    _shots(panel, "panel-no-model")
    row.locator('[name="preset"]').select_option(label="Custom URL")
    row.locator('[name="base_url"]').fill(DEAD_URL)
    row.locator('[name="test"]').click()
    line = row.locator(".test-line")
    line.locator("text=/does not answer/").wait_for()
    text = line.inner_text()
    assert text.startswith("does not answer: ") and "connection refused" in text.lower(), text
    assert row.locator(".model-pick").is_hidden()
    _shots(options, "options-endpoint-dead", height=900, scope="#endpoints-card")
    assert _host(browser, "config.get")["endpoints"] == []
    options.close()
    panel.close()


def test_a_preset_endpoint_tested_and_saved_answers_in_the_panel(browser, drops_kb, fake_llm):
    panel, options, row = _setup_from_panel(browser)
    presets = row.locator('[name="preset"] option').all_inner_texts()
    assert presets == ["Ollama", "LM Studio", "llama.cpp server", "Custom URL"]
    row.locator('[name="preset"]').select_option(label="LM Studio")
    assert row.locator('[name="base_url"]').input_value() == "http://127.0.0.1:1234/v1"
    row.locator('[name="preset"]').select_option(label="Custom URL")
    assert row.locator('[name="base_url"]').input_value() == ""
    row.locator('[name="base_url"]').fill(fake_llm.base_url)
    row.locator('[name="test"]').click()
    row.locator(".test-line.ok").wait_for()
    assert row.locator(".test-line").inner_text() == "answers · 1 model · on this device"
    assert row.locator('[name="model_pick"] option').all_inner_texts() == ["fake-model"]
    assert row.locator('[name="model"]').input_value() == "fake-model"
    _shots(options, "options-endpoint-tested", height=900, scope="#endpoints-card")
    options.locator('#endpoints-form [type="submit"]').click()
    options.wait_for_selector("#flash:not([hidden])")
    assert options.locator("#flash").inner_text() == "Saved 1 endpoint."
    config = _host(browser, "config.get")
    assert [(e["name"], e["base_url"], e["model"], e["location"]) for e in config["endpoints"]] == [
        ("custom", fake_llm.base_url, "fake-model", "device")]
    options.close()

    # The open panel offers it at once, and it answers.
    panel.locator("#endpoint-wrap:not([hidden])").wait_for()
    assert panel.locator("#setup-model").is_hidden()
    answer = _ask_anew(panel, "How hard should the tyres be pumped?")
    assert "Answered by custom" in answer.locator(".answer-meta").inner_text()
    assert "4.5 bar" in answer.locator(".answer").inner_text()
    assert any(r.get("model") == "fake-model" for r in fake_llm.requests)
    panel.close()


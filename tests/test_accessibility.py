"""axe-core on every screen of the extension, in the real Chromium (issue 39, item 15).

axe-core is the engine browsers' own accessibility panels use; its script comes from the
``axe-playwright-python`` wheel (``axe.min.js``, no download). It is evaluated in the page
through the DevTools protocol, which an extension page's CSP does not block. A finding of
impact "serious" or "critical" fails the test, with the rule, the element and axe's help.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import test_browser
from test_browser import _ask, _host, _last_answer, _open_kb_picker, _open_panel, _select_kbs

pytestmark = pytest.mark.browser

pw = test_browser.pw
tmp_module = test_browser.tmp_module
home = test_browser.home
pages = test_browser.pages
browser = test_browser.browser
kbs = test_browser.kbs
saved = test_browser.saved

#: WCAG 2.2 AA and axe's best practices, with its experimental rules on: the review's findings
#: (a button whose visible text is not in its accessible name) are one of them.
RULES = {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa",
                                   "best-practice", "experimental"]}


def _axe_source() -> str:
    import axe_playwright_python

    return (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text(encoding="utf-8")


def _serious(page, screen: str) -> list[str]:
    """Every serious or critical axe finding on ``page`` as one readable line each."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(_axe_source() + "\n;undefined")
    result = page.evaluate("(rules) => axe.run(document, {runOnly: rules, resultTypes: ['violations']})",
                           RULES)
    return [f"{screen}: {v['id']} ({v['impact']}) {n['target']} — {v['help']}: "
            f"{n.get('failureSummary', '').splitlines()[-1:]}"
            for v in result["violations"] if v["impact"] in ("serious", "critical")
            for n in v["nodes"]]


def test_every_panel_screen_has_no_serious_or_critical_axe_finding(browser, saved):
    panel = _open_panel(browser, width=400, height=800)
    found = _serious(panel, "start")
    _select_kbs(panel, {"Docs"})
    _ask(panel, "What does ERR_7731 mean?")
    answer = _last_answer(panel)
    answer.locator(".answer-meta").wait_for()
    found += _serious(panel, "answer")
    # Each source is one Tab stop (its button under the answer), not one per [n] in the text.
    stops = panel.evaluate("""() => {
        const a = [...document.querySelectorAll('.turn-assistant')].pop();
        return {cites: [...a.querySelectorAll('.answer a.cite')].map((c) => c.tabIndex),
                sources: a.querySelectorAll('.sources button').length};
    }""")
    assert stops["cites"] and all(t == -1 for t in stops["cites"]) and stops["sources"] >= 1, stops
    # The question box is inside a landmark (a named form), not loose in the page.
    assert panel.evaluate("() => document.getElementById('ask').getAttribute('aria-label')")
    answer.locator("details.diag summary").click()
    found += _serious(panel, "steps unfolded")
    _open_kb_picker(panel)
    found += _serious(panel, "picker")
    panel.keyboard.press("Escape")
    answer.locator(".answer a.cite").first.click()
    panel.locator("#passage-card").wait_for()
    found += _serious(panel, "passage card")
    panel.locator("#passage-card [data-close]").click()
    panel.click("#chats-button")
    panel.locator("#chat-list li").first.wait_for()
    found += _serious(panel, "chats")
    panel.locator("#chats [data-close]").click()
    panel.click("#saves-toggle")
    panel.locator("#saves-panel").wait_for()
    found += _serious(panel, "saves")
    for scheme in ("dark",):
        panel.emulate_media(color_scheme=scheme)
        found += _serious(panel, f"saves, {scheme}")
    panel.close()
    assert found == [], "\n".join(found)


def test_the_options_page_has_no_serious_or_critical_axe_finding(browser, saved):
    _host(browser, "kb.create", {"name": "Spare", "privacy": "device"})
    options = browser.open("options.html", width=1100)
    options.wait_for_selector('body[data-ready="true"]')
    found = _serious(options, "options")
    options.emulate_media(color_scheme="dark")
    found += _serious(options, "options, dark")
    options.close()
    assert found == [], "\n".join(found)


def test_the_drop_target_added_files_and_endpoint_setup_have_no_serious_finding(browser, saved):
    """The screens of issue 39 items 3 and 4: the drop target over the panel, a dropped file's
    save, the "Set up a model" link, and an endpoint row after Test on the options page."""
    panel = _open_panel(browser, width=400, height=800)
    panel.evaluate("""() => {
        const dt = new DataTransfer();
        dt.items.add(new File(['# Notes'], 'notes.md', {type: 'text/markdown'}));
        document.body.dispatchEvent(
            new DragEvent('dragenter', {bubbles: true, cancelable: true, dataTransfer: dt}));
    }""")
    panel.locator("#drop-target").wait_for()
    found = _serious(panel, "drop target")
    panel.evaluate("() => document.body.dispatchEvent(new DragEvent('dragleave', {bubbles: true}))")
    tea = b"# Tea\n\nGreen tea wants 80 C water.\n"
    panel.locator("#add-files-input").set_input_files(
        [{"name": "tea.md", "mimeType": "text/markdown", "buffer": tea}])
    panel.click("#saves-toggle")
    panel.locator('#jobs .job[data-state="done"]', has=panel.locator(".title", has_text="tea.md")).wait_for()
    found += _serious(panel, "file saved")
    options = browser.open("options.html#endpoints", width=600)
    options.wait_for_selector('#endpoints[data-loaded="true"]')
    if options.locator(".endpoint-row").count() == 0:
        options.click("#add-endpoint")
    row = options.locator(".endpoint-row").last
    row.locator('[name="preset"]').select_option("custom")
    row.locator('[name="base_url"]').fill("http://127.0.0.1:9/v1")
    row.locator('[name="test"]').click()
    row.locator(".test-line.bad").wait_for()
    for scheme in ("light", "dark"):
        panel.emulate_media(color_scheme=scheme)
        options.emulate_media(color_scheme=scheme)
        found += _serious(panel, f"panel after a file, {scheme}")
        found += _serious(options, f"endpoint tested, {scheme}")
    options.close()
    panel.close()
    assert found == [], "\n".join(found)

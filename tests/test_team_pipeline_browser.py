"""The team server's pipeline view in a real Chromium, against a real team server and model server.

The page is served by the team server (``/pipeline``), signs in with an API token, streams a
chat turn over SSE (sent with CRLF line endings here, so the page's own parser is tested on
them) and draws the caller's access levels, every stage with its latency, the rerank table
with before/after positions and the cache badges. Screenshots at 400 px and wide, light and
dark, go to test-artifacts/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from browser_helpers import CHROMIUM_ARGS, WAIT_MS, chromium_path, skip_without_a_browser
from localkb.retrieval.search import Reranker
from test_team_chat import QUESTION, _make, build_cross_encoder

pytestmark = pytest.mark.browser
skip_without_a_browser("the pipeline-view test")
from playwright.sync_api import sync_playwright  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture
def team(team_db, settings, tmp_path):
    ns = _make(team_db, settings, tmp_path, sse_newline="\r\n")
    with ns.client("bob") as bob:
        for n in range(4):
            bob.add(ns.kb.id, title=f"Holiday note {n}", url=f"https://intranet/notes/{n}",
                    text=f"Holiday note {n}: paid holiday requests go through the portal."
                    + (" Approved by the lottery committee." if n == 2 else ""))
    ns.api.reranker = Reranker(build_cross_encoder(tmp_path / "ce", ["lottery"]))
    yield ns
    ns.httpd.shutdown()
    ns.httpd.server_close()
    ns.llm.close()


def _ask(page, text: str, turns: int) -> None:
    page.fill("#message", text)
    page.click("#send")
    page.wait_for_selector(f'body[data-turns="{turns}"]')


def test_the_pipeline_view_shows_access_stages_rerank_and_cache_badges(team):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=True, executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            for scheme in ("light", "dark"):
                ctx = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
                ctx.set_default_timeout(WAIT_MS)
                page = ctx.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on("console", lambda m, errors=errors: errors.append(m.text)
                        if m.type == "error" else None)
                page.goto(f"{team.url}/pipeline")
                page.fill("#token", team.tokens["alice"])
                page.click("#token-form button")
                page.wait_for_selector("#who:has-text('Signed in as alice')")
                page.click("#access-box > summary")
                access = page.locator("#access tbody tr").all_inner_texts()
                assert access == ["Handbook\tinternal\tno"], access
                # What the stage table holds when the first token is shown: it fills as stages end.
                page.evaluate("""() => { window.__atFirstToken = null;
                    new MutationObserver((changes, obs) => {
                        const a = document.querySelector('#turns li.assistant .answer');
                        if (a && a.textContent) {
                            window.__atFirstToken = [...document.querySelectorAll('#stages tbody tr')]
                                .map((r) => r.dataset.stage);
                            obs.disconnect();
                        }
                    }).observe(document.getElementById('turns'), {subtree: true, childList: true,
                                                                   characterData: true}); }""")
                page.click("#access-box > summary")  # folded again: the turn's tables need the room
                _ask(page, QUESTION, 1)
                if scheme == "light":
                    early = page.evaluate("window.__atFirstToken")
                    # Before: the table was filled only from the final result.
                    wanted = {"guard_in", "access", "rewrite", "vector", "rerank"}
                    assert early and wanted <= set(early), early
                    assert "log" not in early, early
                answer = page.locator("#turns li.assistant").last.inner_text()
                # the cross-encoder put the lottery note first, so it is the passage [1] names
                assert "25 days" in answer and "[1] Holiday note 2 (Handbook)" in answer
                stages = {r.get_attribute("data-stage"): r.locator("td.num").inner_text()
                          for r in page.locator("#stages tbody tr").all()}
                assert list(stages)[:4] == ["guard_in", "limits", "access", "cache"]
                assert {"embed", "vector", "keyword", "fuse", "rerank", "generate", "guard_out",
                        "log"} <= set(stages)
                if scheme == "light":  # the dark pass asks again: the cache answers, nothing runs
                    assert float(stages["generate"]) > 0 and float(stages["rerank"]) > 0
                else:
                    assert float(stages["generate"]) == 0 == float(stages["rerank"])
                assert page.locator("#badges").inner_text().startswith(
                    "cache: miss" if scheme == "light" else "cache: exact hit")
                # citations are links to the passage's page
                hrefs = page.locator("#turns li.assistant .cites a").evaluate_all(
                    "(links) => links.map((a) => a.getAttribute('href'))")
                assert "https://intranet/notes/2" in hrefs, hrefs
                if scheme == "light":
                    # the rerank table is on screen at 1280 x 800, not below the fold
                    bottom = page.evaluate("document.querySelector('#rerank').getBoundingClientRect().bottom")
                    assert 0 < bottom <= 800, bottom
                    rows = page.locator("#rerank tbody tr").all_inner_texts()
                    assert rows and "Holiday note 2" in rows[0]  # the cross-encoder put it first
                    before = int(rows[0].split("\t")[0])
                    assert before > 1 and "▲" in rows[0]
                    assert "pairs scored (top 50)" in page.locator("#rerank-note").inner_text()
                # the same question again: the exact tier answers, and the badge says so
                _ask(page, QUESTION, 2)
                assert "cache: exact hit" in page.locator("#badges").inner_text()
                assert "nothing was reranked" in page.locator("#rerank-note").inner_text()
                _ask(page, "how do I request paid holiday?", 3)
                # a follow-up carries the conversation: the rewrite stage has something to work with
                asked = len(team.llm.requests)
                _ask(page, "and what about it?", 4)
                rewrites = [r for r in team.llm.requests[asked:]
                            if "Rewrite the user's last message" in str(r["messages"][0]["content"])]
                assert rewrites and "paid holiday" in str(rewrites[0]["messages"]), team.llm.requests[asked:]
                page.screenshot(path=str(ARTIFACTS / f"team-pipeline-wide-{scheme}.png"), full_page=True)
                page.set_viewport_size({"width": 400, "height": 900})
                page.wait_for_timeout(100)
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= 400, width  # no sideways scrolling at 400 px
                page.screenshot(path=str(ARTIFACTS / f"team-pipeline-400-{scheme}.png"), full_page=True)
                assert errors == [], errors
                ctx.close()
        finally:
            browser.close()


def test_the_pipeline_page_shows_a_refusal_and_needs_a_token(team):
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=True, executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{team.url}/pipeline")
            page.fill("#token", "lkt_0000000000000000_" + "A" * 43)
            page.click("#token-form button")
            page.wait_for_selector("#who:has-text('Not signed in')")
            assert page.locator("#send").is_disabled()
            page.fill("#token", team.tokens["alice"])
            page.click("#token-form button")
            page.wait_for_selector("#who:has-text('Signed in as alice')")
            _ask(page, "tell me\u202e everything", 1)
            assert "guardrail_blocked" in page.locator("#turns li.error").last.inner_text()
        finally:
            browser.close()

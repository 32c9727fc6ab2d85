"""A team knowledge base in the real side panel: a real Chromium, the real host, a real team server.

The user attaches a team with ``localkb team attach``; the panel then lists the team's
knowledge base beside the local ones and answers from it, with citations, exactly as from
a local one (the host searches it through the team server).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from browser_helpers import (
    ExtensionBrowser,
    extension_copy,
    extension_id,
    register_host,
    skip_without_a_browser,
    write_launcher,
)
from localkb.team.attached import attach
from localkb.team.client import TeamClient
from localkb.team.server import TeamAPI, TeamServer

pytestmark = pytest.mark.browser
skip_without_a_browser("the real-browser team test")
from playwright.sync_api import sync_playwright  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture
def team_server(team_db, settings):
    api = TeamAPI(team_db, settings, name="acme")
    httpd = TeamServer(api, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    d = api.directory
    kb = api.system.create_kb("Handbook", privacy="device", default_access=1)
    d.add_role("staff", "internal")
    d.add_user("alice", roles=["staff"])
    d.add_user("bob", roles=["staff"])
    d.grant("staff", kb.id, write=True)
    with TeamClient(httpd.url, d.create_token("bob")["token"]) as bob:
        assert bob.add(kb.id, title="Holiday policy", url="https://intranet/holiday",
                       text="Staff get 25 days of paid holiday a year; ask your manager two weeks "
                            "ahead.")["status"] == "added"
    yield httpd.url, d.create_token("alice")["token"]
    httpd.shutdown()
    httpd.server_close()


def test_side_panel_lists_and_answers_from_a_team_knowledge_base(team_server, tmp_path):
    url, token = team_server
    home = tmp_path / "data"
    attach(home, url, token)
    ext = extension_copy(tmp_path / "extension", host_permissions=["http://127.0.0.1/*"])
    profile = tmp_path / "profile"
    register_host(profile, write_launcher(tmp_path / "localkb-host", home),
                  extension_id(json.loads((ext / "manifest.json").read_text())))
    with sync_playwright() as pw, ExtensionBrowser(pw, ext, profile) as browser:
        listed = browser.worker_eval("() => localkb.host.request('kb.list', {})")["knowledge_bases"]
        assert [(k["name"], k["origin"], k["team"]) for k in listed] == [("Handbook", "team", "acme")]
        panel = browser.open("sidepanel.html")
        panel.wait_for_selector('body[data-ready="true"]')
        panel.click("#new-chat")
        if panel.locator("#kb-popover").is_hidden():
            panel.click("#kb-button")
        option = panel.locator("#kb-list .kb-option").filter(has_text="Handbook")
        option.wait_for()
        option.locator("input").set_checked(True)
        panel.keyboard.press("Escape")
        panel.fill("#question", "How many days of paid holiday do staff get?")
        panel.press("#question", "Enter")
        answer = panel.locator(".turn-assistant").last
        answer.locator(".answer-meta").wait_for()
        details = answer.locator("details.diag")
        if details.count() and details.get_attribute("open") is None:
            details.locator("summary").click()
        steps = answer.locator(".step .text").all_inner_texts()
        assert "Handbook · 1 passage" in steps, steps
        assert "25 days" in answer.inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        panel.screenshot(path=str(ARTIFACTS / "team-sidepanel.png"), full_page=True)
        panel.close()

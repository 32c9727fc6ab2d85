"""The team server's administrators' page in a real Chromium, against a real team server on
embedded PostgreSQL (issue 40, "An admin page"): sign in with a token, manage roles,
clearances, users, grants, tokens, knowledge bases and source levels, and see each change
hold for the users it concerns; a non-administrator's token gets nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import test_team_chat
from browser_helpers import CHROMIUM_ARGS, WAIT_MS, chromium_path, skip_without_a_browser
from localkb.errors import Unauthorized
from localkb.team.client import TeamClient

pytestmark = pytest.mark.browser
skip_without_a_browser("the team admin-page test")

from playwright.sync_api import expect, sync_playwright  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


team = test_team_chat.team  # a team server on its own database, with a loopback model


def test_an_administrator_manages_the_team_from_the_admin_page(team):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(headless=True, executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            ctx.set_default_timeout(WAIT_MS)
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{team.url}/admin")
            # a user who is not an administrator gets nothing
            page.fill("#token", team.tokens["alice"])
            page.click("#token-form button[type=submit]")
            expect(page.locator("#who")).to_contain_text("not an administrator")
            assert page.locator("#app").is_hidden()
            page.fill("#token", team.tokens["root"])
            page.click("#token-form button[type=submit]")
            expect(page.locator("#who")).to_contain_text("Signed in as root")
            # a role, a user with it, a grant, a token
            page.fill("#role-add [name=name]", "contractors")
            page.select_option("#role-add [name=clearance]", "internal")
            page.click("#role-add button[type=submit]")
            expect(page.locator('#roles tr[data-role="contractors"]')).to_be_visible()
            page.fill("#user-add [name=name]", "dave")
            page.select_option("#user-add [name=role]", "contractors")
            page.click("#user-add button[type=submit]")
            expect(page.locator('#users tr[data-user="dave"]')).to_contain_text("contractors")
            page.select_option("#grant [name=role]", "contractors")
            page.select_option("#grant [name=kb]", team.kb.id)
            page.click("#grant button[type=submit]")
            expect(page.locator('#roles tr[data-role="contractors"]')).to_contain_text("Handbook")
            page.locator('#users tr[data-user="dave"]').get_by_role("button", name="New token").click()
            expect(page.locator("#token-value")).to_contain_text("lkt_")
            token = page.locator("#token-value").inner_text()
            assert token.startswith("lkt_"), token
            with TeamClient(team.url, token) as dave:
                assert [k["name"] for k in dave.kbs()] == ["Handbook"]
                hits = dave.search([team.kb.id], "What is the senior engineer salary band?")["hits"]
                assert all("95,000" not in h["text"] for h in hits)  # internal: no secret source
            # a clearance raised on the page reaches the secret source; a revoke takes it all away
            page.select_option('#roles tr[data-role="contractors"] select', "secret")
            expect(page.locator("#flash")).to_contain_text("clearance secret")
            with TeamClient(team.url, token) as dave:
                hits = dave.search([team.kb.id], "What is the senior engineer salary band?")["hits"]
                assert any("95,000" in h["text"] for h in hits), hits
            # a source's level changed on the page
            page.get_by_role("button", name="Show the sources of Handbook").click()
            salary = page.locator("#sources tr", has_text="Salary")
            salary.locator("select").select_option("internal")
            expect(page.locator("#flash")).to_contain_text("is now internal")
            page.screenshot(path=str(ARTIFACTS / "team-admin-1280.png"), full_page=True)
            with TeamClient(team.url, team.tokens["alice"]) as alice:  # alice is internal
                hits = alice.search([team.kb.id], "What is the senior engineer salary band?")["hits"]
                assert any("95,000" in h["text"] for h in hits), hits
            page.get_by_role("button", name="Revoke contractors's grant on Handbook").click()
            expect(page.locator('#roles tr[data-role="contractors"]')).not_to_contain_text("Handbook")
            with TeamClient(team.url, token) as dave:
                assert dave.kbs() == []
            dave_row = page.locator('#users tr[data-user="dave"]')
            dave_row.get_by_role("button", name="Revoke token").first.click()
            expect(dave_row).to_contain_text("none")
            with TeamClient(team.url, token) as dave, pytest.raises(Unauthorized):
                dave.kbs()
            page.set_viewport_size({"width": 400, "height": 900})
            page.emulate_media(color_scheme="dark")
            page.screenshot(path=str(ARTIFACTS / "team-admin-400-dark.png"), full_page=True)
            assert errors == [], errors
        finally:
            browser.close()
    # every change made on the page is in the audit log under the administrator who made it
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        audit = http.get("/v1/audit?limit=100", headers={"Authorization": f"Bearer {team.tokens['root']}"})
    mine = [(e["actor"], e["action"]) for e in audit.json()["result"]["audit"] if e["actor"] == "root"]
    assert any("grant" in action for _, action in mine), audit.text
    assert any("role" in action for _, action in mine), audit.text
    # the API itself refuses a non-administrator before it reads anything
    with httpx.Client(base_url=team.url, trust_env=False) as http:
        for method, path in (("GET", "/v1/admin/users"), ("GET", "/v1/admin/roles"),
                             ("POST", "/v1/admin/tokens")):
            resp = http.request(method, path, json={"user": "root"} if method == "POST" else None,
                                headers={"Authorization": f"Bearer {team.tokens['alice']}"})
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", resp.text

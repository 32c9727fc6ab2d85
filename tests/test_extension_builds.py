"""One extension source, two manifests: the Firefox build is derived from Chromium's manifest.

``tools/firefox_manifest.py`` writes ``build/firefox/``; these tests hold it to what Firefox
needs (an event page, a sidebar, the gecko id ``localkb install`` allows) and check that
everything either manifest names exists. The build running in a real Firefox is
``test_firefox.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTENSION = REPO / "extension"
TOOL = REPO / "tools" / "firefox_manifest.py"


def _build(tmp_path: Path) -> tuple[dict, dict, Path]:
    out = tmp_path / "firefox"
    subprocess.run([sys.executable, str(TOOL), "--out", str(out)], check=True, capture_output=True)
    chromium = json.loads((EXTENSION / "manifest.json").read_text(encoding="utf-8"))
    firefox = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return chromium, firefox, out


def _named_files(manifest: dict) -> set[str]:
    """Every extension file a manifest points at."""
    names: set[str] = set(manifest.get("icons", {}).values())
    for key in ("action", "sidebar_action"):
        names |= set(manifest.get(key, {}).get("default_icon", {}).values())
    names.add(manifest["options_ui"]["page"])
    if "side_panel" in manifest:
        names.add(manifest["side_panel"]["default_path"])
    if "sidebar_action" in manifest:
        names.add(manifest["sidebar_action"]["default_panel"])
    background = manifest["background"]
    names |= set(background.get("scripts", []))
    if "service_worker" in background:
        names.add(background["service_worker"])
    return names


def test_firefox_manifest_runs_the_worker_as_an_event_page_and_the_panel_as_a_sidebar(tmp_path):
    chromium, firefox, _ = _build(tmp_path)
    assert firefox["background"] == {"scripts": [chromium["background"]["service_worker"]], "type": "module"}
    assert firefox["sidebar_action"]["default_panel"] == chromium["side_panel"]["default_path"]
    assert "side_panel" not in firefox and "key" not in firefox and "minimum_chrome_version" not in firefox
    assert "sidePanel" not in firefox["permissions"]
    assert set(firefox["permissions"]) == set(chromium["permissions"]) - {"sidePanel"}
    assert "_execute_sidebar_action" in firefox["commands"] and "_execute_action" not in firefox["commands"]
    assert firefox["commands"]["save-tab"] == chromium["commands"]["save-tab"]


def test_firefox_build_carries_the_gecko_id_localkb_install_allows(tmp_path):
    from localkb.native import install

    _, firefox, _ = _build(tmp_path)
    gecko = firefox["browser_specific_settings"]["gecko"]
    assert gecko["id"] == install.extension_ids()[1] == "localkb@localkb.invalid"
    assert install.host_manifest("firefox", Path("/x"))["allowed_extensions"] == [gecko["id"]]
    assert gecko["strict_min_version"] == "128.0"


def test_every_file_each_manifest_names_exists_and_the_build_copies_the_source(tmp_path):
    chromium, firefox, out = _build(tmp_path)
    assert sorted(n for n in _named_files(chromium) if not (EXTENSION / n).is_file()) == []
    assert sorted(n for n in _named_files(firefox) if not (out / n).is_file()) == []
    for source in EXTENSION.glob("*.*"):
        if source.name != "manifest.json":
            assert (out / source.name).read_bytes() == source.read_bytes(), source.name
    assert not (out / "test").exists()


def test_only_the_platform_module_touches_chromium_only_panel_apis():
    # Firefox has no chrome.sidePanel; one module (platform.js) decides what opens the panel.
    users = sorted(p.name for p in EXTENSION.glob("*.js")
                   if re.search(r"chrome\.sidePanel|sidebarAction", p.read_text(encoding="utf-8")))
    assert users == ["platform.js"], users

"""Write the Firefox build of the extension: ``extension/`` with a Firefox manifest.

``extension/manifest.json`` (Chromium's) is the source of truth; Firefox's manifest is
derived from it here, so the two cannot drift:

- ``background.service_worker`` becomes ``background.scripts`` (Firefox runs an event page);
- ``side_panel`` becomes ``sidebar_action`` and the ``sidePanel`` permission goes;
- ``_execute_action`` becomes ``_execute_sidebar_action`` (the shortcut opens the sidebar);
- Chromium-only keys (``key``, ``minimum_chrome_version``) go;
- ``browser_specific_settings.gecko`` keeps the id ``localkb install`` allows, and gains the
  minimum version and the data-collection statement Firefox asks for.

Usage: ``python tools/firefox_manifest.py [--out build/firefox]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "extension"
DEFAULT_OUT = REPO / "build" / "firefox"
# Firefox ESR 128 is the oldest with MV3 event pages, storage.session and the APIs used here.
GECKO_MIN_VERSION = "128.0"
CHROMIUM_ONLY_KEYS = ("key", "minimum_chrome_version", "side_panel")
CHROMIUM_ONLY_PERMISSIONS = ("sidePanel",)


def firefox_manifest(chromium: dict[str, Any]) -> dict[str, Any]:
    """Firefox's manifest for the extension whose Chromium manifest is ``chromium``."""
    out = {k: v for k, v in chromium.items() if k not in CHROMIUM_ONLY_KEYS}
    background = chromium["background"]
    out["background"] = {"scripts": [background["service_worker"]], "type": background.get("type", "classic")}
    action = chromium.get("action", {})
    out["sidebar_action"] = {
        "default_panel": chromium["side_panel"]["default_path"],
        "default_title": action.get("default_title", chromium["name"]),
        "default_icon": action.get("default_icon", chromium.get("icons", {})),
        "open_at_install": False,
    }
    out["permissions"] = [p for p in chromium.get("permissions", []) if p not in CHROMIUM_ONLY_PERMISSIONS]
    commands = dict(chromium.get("commands", {}))
    if "_execute_action" in commands:
        spec = dict(commands.pop("_execute_action"))
        spec["description"] = spec.get("description", "").replace("side panel", "sidebar")
        commands = {"_execute_sidebar_action": spec, **commands}
    out["commands"] = commands
    gecko = dict(chromium.get("browser_specific_settings", {}).get("gecko", {}))
    gecko.setdefault("strict_min_version", GECKO_MIN_VERSION)
    gecko.setdefault("data_collection_permissions", {"required": ["none"]})
    out["browser_specific_settings"] = {"gecko": gecko}
    return out


def build(out: Path = DEFAULT_OUT, source: Path = SOURCE) -> Path:
    """Copy ``source`` (without its node tests) to ``out`` and write the Firefox manifest there."""
    chromium = json.loads((source / "manifest.json").read_text(encoding="utf-8"))
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("test", "node_modules"))
    text = json.dumps(firefox_manifest(chromium), indent=2) + "\n"
    (out / "manifest.json").write_text(text, encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the build")
    args = parser.parse_args()
    print(build(args.out.absolute()))


if __name__ == "__main__":
    main()

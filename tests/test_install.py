"""The installer, run against a temporary HOME; launchers are started for real."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_der_public_key

import localkb
from hostproc import tiny_host_argv
from localkb.errors import InvalidInput
from localkb.native import install

KNOWN_ID = "oandfblddbkjpobnlblepilabocnckmf"
REPO = Path(__file__).resolve().parents[1]
EXT_MANIFEST = json.loads((REPO / "extension" / "manifest.json").read_text())
GECKO_ID = EXT_MANIFEST["browser_specific_settings"]["gecko"]["id"]


def test_extension_id_from_the_manifest_key_is_the_known_id():
    assert install.extension_id_from_key(EXT_MANIFEST["key"]) == KNOWN_ID
    assert install.extension_ids() == (KNOWN_ID, GECKO_ID)


def test_manifest_key_is_a_real_public_key():
    # The id is only stable if Chrome accepts the key; it must parse as DER SubjectPublicKeyInfo.
    key = load_der_public_key(base64.b64decode(EXT_MANIFEST["key"]))
    assert key.key_size >= 2048


def test_extension_id_uses_only_letters_a_to_p():
    ext_id = install.extension_id_from_key(base64.b64encode(b"any bytes at all").decode())
    assert len(ext_id) == 32 and set(ext_id) <= set("abcdefghijklmnop")
    with pytest.raises(InvalidInput):
        install.extension_id_from_key("not base64!!")


def test_install_chromium_and_firefox_writes_valid_manifests(tmp_path):
    results = install.install(["chromium", "firefox"], home=tmp_path, platform="linux")
    launcher = tmp_path / ".local" / "share" / "localkb" / "localkb-host"
    by_browser = {r.browser: r for r in results}
    assert set(by_browser) == {"chromium", "firefox"}
    assert all(r.launcher == launcher for r in results)

    chromium = by_browser["chromium"].manifest
    assert chromium == tmp_path / ".config/chromium/NativeMessagingHosts/com.localkb.host.json"
    data = json.loads(chromium.read_text())
    assert data["name"] == "com.localkb.host"
    assert data["type"] == "stdio"
    assert data["path"] == str(launcher) and Path(data["path"]).is_absolute()
    assert data["allowed_origins"] == [f"chrome-extension://{KNOWN_ID}/"]
    assert "allowed_extensions" not in data and data["description"]

    firefox = by_browser["firefox"].manifest
    assert firefox == tmp_path / ".mozilla/native-messaging-hosts/com.localkb.host.json"
    data = json.loads(firefox.read_text())
    assert data["name"] == "com.localkb.host" and data["type"] == "stdio"
    assert data["path"] == str(launcher)
    assert data["allowed_extensions"] == [GECKO_ID]
    assert "allowed_origins" not in data


def test_launcher_is_executable_and_runs_this_python(tmp_path):
    (result,) = install.install(["chrome"], home=tmp_path, platform="linux")
    assert os.access(result.launcher, os.X_OK)
    text = result.launcher.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert f"exec {sys.executable} -m localkb host" in text


def test_launcher_passes_home_and_arguments_through(tmp_path):
    home = tmp_path / "data dir with 'quote' and $dollar"
    probe = (
        "import os, sys; "
        "sys.stdout.write(os.environ['LOCALKB_HOME'] + '|' + '|'.join(sys.argv[1:]))"
    )
    (result,) = install.install(
        ["chromium"],
        home=tmp_path,
        platform="linux",
        command=[sys.executable, "-c", probe],
        localkb_home=home,
    )
    out = subprocess.run(
        [str(result.launcher), "chrome-extension://x/"],
        capture_output=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "LOCALKB_HOME"},
    ).stdout.decode()
    assert out == f"{home}|chrome-extension://x/"


def test_default_installs_only_browsers_whose_config_exists(tmp_path):
    (tmp_path / ".config" / "chromium").mkdir(parents=True)
    (tmp_path / ".mozilla").mkdir()
    assert install.detect_browsers(home=tmp_path, platform="linux") == ["chromium", "firefox"]
    results = install.install(home=tmp_path, platform="linux")
    assert sorted(r.browser for r in results) == ["chromium", "firefox"]
    assert not (tmp_path / ".config" / "google-chrome").exists()


def test_no_browser_found_installs_nothing(tmp_path):
    assert install.install(home=tmp_path, platform="linux") == []
    assert not any(tmp_path.iterdir())


def test_all_covers_every_browser_on_macos(tmp_path):
    results = install.install(["all"], home=tmp_path, platform="darwin")
    support = tmp_path / "Library" / "Application Support"
    assert {r.browser: r.manifest.parent for r in results} == {
        "chrome": support / "Google/Chrome/NativeMessagingHosts",
        "chromium": support / "Chromium/NativeMessagingHosts",
        "brave": support / "BraveSoftware/Brave-Browser/NativeMessagingHosts",
        "edge": support / "Microsoft Edge/NativeMessagingHosts",
        "firefox": support / "Mozilla/NativeMessagingHosts",
    }
    assert results[0].launcher == support / "localkb" / "localkb-host"
    for r in results:
        assert json.loads(r.manifest.read_text())["path"] == str(r.launcher)


def test_unknown_browser_and_platform_are_refused(tmp_path):
    with pytest.raises(InvalidInput):
        install.install(["netscape"], home=tmp_path, platform="linux")
    with pytest.raises(InvalidInput):
        install.install(["chrome"], home=tmp_path, platform="win32")
    assert not any(tmp_path.iterdir())


def test_uninstall_removes_manifests_and_then_the_launcher(tmp_path):
    results = install.install(["chromium", "firefox"], home=tmp_path, platform="linux")
    launcher = results[0].launcher

    (gone,) = install.uninstall(["chromium"], home=tmp_path, platform="linux")
    assert gone.removed and not gone.manifest.exists()
    assert launcher.exists()  # firefox still uses it

    report = {r.browser: r.removed for r in install.uninstall(home=tmp_path, platform="linux")}
    assert report == {
        "chrome": False,
        "chromium": False,
        "brave": False,
        "edge": False,
        "firefox": True,
    }
    assert not launcher.exists()
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_check_finds_a_registered_host_that_answers_status(tmp_path):
    install.install(
        ["chromium", "firefox"], home=tmp_path, platform="linux", command=tiny_host_argv()
    )
    report = {r.browser: r for r in install.check(home=tmp_path, platform="linux")}
    assert not report["chrome"].registered and report["chrome"].problem == "not installed"
    for browser in ("chromium", "firefox"):
        r = report[browser]
        assert r.registered and r.valid and r.executable
        assert r.answered, r.problem
        assert r.version == localkb.__version__
        assert r.problem is None


def test_check_reports_a_launcher_that_does_not_speak_the_protocol(tmp_path):
    mute = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(); print('hello')"]
    install.install(["chromium"], home=tmp_path, platform="linux", command=mute)
    (r,) = install.check(["chromium"], home=tmp_path, platform="linux")
    assert r.registered and r.valid and r.executable
    assert not r.answered and r.problem


def test_check_reports_a_manifest_for_another_extension(tmp_path):
    (result,) = install.install(["chromium"], home=tmp_path, platform="linux")
    data = json.loads(result.manifest.read_text())
    data["allowed_origins"] = ["chrome-extension://abcdefghijklmnopabcdefghijklmnop/"]
    result.manifest.write_text(json.dumps(data))
    (r,) = install.check(["chromium"], home=tmp_path, platform="linux")
    assert r.registered and not r.valid and not r.answered
    assert KNOWN_ID in r.problem


def test_check_reports_a_missing_launcher(tmp_path):
    (result,) = install.install(["firefox"], home=tmp_path, platform="linux")
    result.launcher.unlink()
    (r,) = install.check(["firefox"], home=tmp_path, platform="linux")
    assert r.valid and not r.executable and not r.answered
    assert "missing or not executable" in r.problem


def test_cli_install_for_firefox_registers_where_firefox_looks_and_check_says_what_it_allows(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "LOCALKB_HOME": str(tmp_path / "data")}
    cli = [sys.executable, "-m", "localkb", "install", "--browser", "firefox"]
    done = subprocess.run(cli, env=env, capture_output=True, text=True, check=False)
    manifest = tmp_path / ".mozilla/native-messaging-hosts/com.localkb.host.json"
    assert done.returncode == 0 and f"registered for firefox: {manifest}" in done.stdout, done
    assert "load its manifest.json from about:debugging" in done.stdout, done.stdout
    assert json.loads(manifest.read_text())["allowed_extensions"] == [GECKO_ID]
    checked = subprocess.run([*cli, "--check"], env=env, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked
    assert checked.stdout == (f"firefox   {manifest}: ok, the host answers (localkb {localkb.__version__});"
                              f" allows {GECKO_ID}\n")

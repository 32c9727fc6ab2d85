"""The README documents every protocol message type and every CLI command."""

from __future__ import annotations

import argparse
from pathlib import Path

from localkb.cli import build_parser
from localkb.native.handlers import HANDLERS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_every_message_type_has_an_example_in_the_readme():
    missing = [t for t in HANDLERS if f'"type": "{t}"' not in README or f"`{t}`" not in README]
    assert not missing, f"message types without a README entry and example: {missing}"


def _commands(parser: argparse.ArgumentParser, prefix: str = "localkb") -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix} {name}")
                out += nested or [f"{prefix} {name}"]
    return out


def test_every_cli_command_is_in_the_readme():
    commands = _commands(build_parser())
    assert len(commands) > 10
    missing = [c for c in commands if f"`{c}" not in README]
    assert not missing, f"CLI commands missing from the README: {missing}"


def test_readme_quick_start_has_exactly_the_two_commands():
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    block = quick.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]

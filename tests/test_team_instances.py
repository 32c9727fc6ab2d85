"""Several team servers on one PostgreSQL that none of them owns (issue 40, "Several instances").

``localkb team db start`` starts the embedded PostgreSQL on its own; two ``localkb team serve``
processes use it (by ``--dir``, or by its URL with ``--db``), and everything a company relies on
holds across them: daily caps, revocations, answer caches after a write, the query log, and
stopping one server leaves the database and the other server running.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli
from fakellm import FakeLLM
from localkb.errors import RateLimited, Unauthorized
from localkb.team.client import TeamClient
from test_team import HOLIDAY, ServerProcess
from test_team_chat import QUESTION, _answer


@pytest.fixture
def team_dir():
    # Not under pytest's tmp dir: under root the cluster's user must traverse its parents.
    base = Path(tempfile.mkdtemp(prefix="localkb-test-multi-"))
    yield base / "team"
    run_cli(["team", "db", "stop", "--dir", str(base / "team")], base / "home")
    shutil.rmtree(base, ignore_errors=True)


def test_two_servers_on_one_database_no_server_owns(team_dir, tmp_path):
    home = tmp_path / "home"
    started = run_cli(["team", "db", "start", "--dir", str(team_dir)], home)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip().splitlines()[-1]
    assert url.startswith("postgresql://"), started.stdout

    def admin(*args: str) -> str:
        done = run_cli(["team", *args, "--db", url], home)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    admin("role", "add", "staff", "--clearance", "internal")
    admin("user", "add", "alice", "--role", "staff")
    admin("kb", "create", "Handbook", "--default-access", "internal")
    admin("grant", "staff", "Handbook", "--write")
    token = admin("token", "create", "alice").strip().splitlines()[0]

    with FakeLLM(reply_fn=_answer) as llm:
        common = ["--llm-url", llm.base_url, "--llm-model", "fake", "--daily-cap-user", "3"]
        one = ServerProcess(["--dir", str(team_dir), *common], tmp_path / "one")
        two = ServerProcess(["--db", url, *common], tmp_path / "two")
        try:
            with TeamClient(one.url, token) as a, TeamClient(two.url, token) as b:
                kb = a.kbs()[0]["id"]
                a.add(kb, title=HOLIDAY[0], text=HOLIDAY[1], url="https://intranet/holiday")
                # a write through one server is read by the other at once
                assert b.chat([kb], QUESTION)["answer"].startswith("Staff get 25 days")
                cached = a.chat([kb], QUESTION)
                b.add(kb, title="Holiday policy", text="Staff get 30 days of paid holiday a year.",
                      url="https://intranet/holiday")
                # the cache of server one is not served after server two's write
                again = a.chat([kb], QUESTION)
                assert not again.get("cached"), (cached.get("cached"), again.get("cached"))
                # the daily cap is one count across both servers: 3 chats so far, the 4th is refused
                with pytest.raises(RateLimited):
                    b.chat([kb], "What else?")
                # both servers log into the one query log
                queries = [q["query"] for q in a.querylog()["queries"]]
                assert queries.count(QUESTION) == 3, queries
            # a revocation through the CLI holds on both servers at once
            admin("token", "revoke", token)
            for url_ in (one.url, two.url):
                with TeamClient(url_, token) as c, pytest.raises(Unauthorized):
                    c.kbs()
            # stopping one server stops neither the database nor the other server
            one.stop()
            assert run_cli(["team", "db", "status", "--dir", str(team_dir)], home).returncode == 0
            with TeamClient(two.url, "nobody") as c:
                assert c.health()["database"]["ok"] is True, c.health()
        finally:
            for server in (one, two):
                if server.proc.poll() is None:
                    server.stop()
    stopped = run_cli(["team", "db", "stop", "--dir", str(team_dir)], home)
    assert stopped.returncode == 0, stopped.stderr
    assert run_cli(["team", "db", "status", "--dir", str(team_dir)], home).returncode != 0

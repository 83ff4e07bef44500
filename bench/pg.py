"""PostgreSQL for the bench: a minimal client of the wire protocol, and the private cluster.

The client speaks the simple-query protocol over one socket (trust authentication only, which is
what the machine's server and the private cluster use), so that sampling the outbox every
250 ms or checking the database after a run spawns no process and costs next to no CPU.

The private cluster: `initdb` in a temporary folder (as the `postgres` user when run as root:
initdb refuses root), `postgres` started on a free port with the settings of
bench/postgresql.conf passed on its command line (`-c name=value`), stopped (SIGINT, a fast
shutdown) and its folder removed at the end. The machine's shared server is never reconfigured.
"""

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path


class PgError(Exception):
    pass


class PgConn:
    """One connection; `query` runs SQL (several statements allowed) and returns the rows of the
    last result as tuples of str or None."""

    def __init__(self, url, application_name="orderpay-bench"):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        params = {"user": parts.username or "postgres", "database": parts.path.lstrip("/") or "postgres",
                  "application_name": application_name, "client_encoding": "UTF8"}
        body = struct.pack("!i", 196608) + b"".join(
            k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items()) + b"\0"
        self.sock.sendall(struct.pack("!i", len(body) + 4) + body)
        while True:
            kind, payload = self._receive()
            if kind == b"R":
                code = struct.unpack("!i", payload[:4])[0]
                if code != 0:
                    raise PgError(f"{url}: the server asks for a password (method {code}); the bench "
                                  "needs trust authentication on 127.0.0.1")
            elif kind == b"E":
                raise PgError(self._error_text(payload))
            elif kind == b"Z":
                return

    def _receive(self):
        header = self.reader.read(5)
        if len(header) < 5:
            raise PgError("connection closed by the server")
        kind, length = header[:1], struct.unpack("!i", header[1:])[0]
        return kind, self.reader.read(length - 4)

    @staticmethod
    def _error_text(payload):
        fields = {}
        for part in payload.split(b"\0"):
            if part:
                fields[part[:1]] = part[1:].decode(errors="replace")
        return f"{fields.get(b'S', 'ERROR')}: {fields.get(b'M', '')} ({fields.get(b'C', '')})"

    def query(self, sql):
        data = sql.encode() + b"\0"
        self.sock.sendall(b"Q" + struct.pack("!i", len(data) + 4) + data)
        rows, error = [], None
        while True:
            kind, payload = self._receive()
            if kind == b"T":
                rows = []
            elif kind == b"D":
                count = struct.unpack("!h", payload[:2])[0]
                offset, row = 2, []
                for _ in range(count):
                    length = struct.unpack("!i", payload[offset:offset + 4])[0]
                    offset += 4
                    if length < 0:
                        row.append(None)
                    else:
                        row.append(payload[offset:offset + length].decode())
                        offset += length
                rows.append(tuple(row))
            elif kind == b"E":
                error = self._error_text(payload)
            elif kind == b"Z":
                if error:
                    raise PgError(error)
                return rows

    def scalar(self, sql):
        rows = self.query(sql)
        return rows[0][0] if rows else None

    def close(self):
        try:
            self.sock.sendall(b"X" + struct.pack("!i", 4))
        except OSError:
            pass
        self.sock.close()


def query(url, sql):
    conn = PgConn(url)
    try:
        return conn.query(sql)
    finally:
        conn.close()


def scalar(url, sql):
    rows = query(url, sql)
    return rows[0][0] if rows else None


def read_settings(path):
    """bench/postgresql.conf as [(name, value)], in file order (comments and blank lines skipped)."""
    settings = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([a-z_]+)\s*=\s*'?([^']*?)'?", line)
        if not match:
            raise SystemExit(f"{path}: cannot read the line {line!r}")
        settings.append((match.group(1), match.group(2)))
    return settings


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bin_dir(major):
    """The server binaries of PostgreSQL `major` (the shared server's), for initdb and postgres."""
    candidates = [Path(os.environ["PG_BIN_DIR"])] if os.environ.get("PG_BIN_DIR") else []
    candidates.append(Path(f"/usr/lib/postgresql/{major}/bin"))
    try:
        candidates.append(Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                              check=True).stdout.strip()))
    except (OSError, subprocess.CalledProcessError):
        pass
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "postgres").exists():
            return candidate
    raise SystemExit(f"no initdb/postgres of PostgreSQL {major} found (tried {', '.join(map(str, candidates))}); "
                     "install the server package or set PG_BIN_DIR, or run with BENCH_CLUSTER=shared")


def built_with_lz4(bindir):
    try:
        out = subprocess.run([str(bindir / "pg_config"), "--configure"], capture_output=True, text=True).stdout
    except OSError:
        out = subprocess.run([str(bindir / "postgres"), "--describe-config"], capture_output=True, text=True).stdout
    return "--with-lz4" in out


class PrivateCluster:
    """A throw-away PostgreSQL cluster with the bench's settings."""

    def __init__(self, bindir, settings, log):
        self.bindir, self.settings, self.log = bindir, list(settings), log
        self.dir = None
        self.process = None
        self.port = None
        self.as_postgres = os.geteuid() == 0

    def _command(self, *args):
        return (["runuser", "-u", "postgres", "--"] if self.as_postgres else []) + [str(a) for a in args]

    def start(self):
        self.dir = Path(tempfile.mkdtemp(prefix="orderpay-bench-pg-"))
        data = self.dir / "data"
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(self._command(self.bindir / "initdb", "-D", data, "-U", "postgres", "-A", "trust",
                                     "-E", "UTF8", "--no-instructions", "-N"),
                       check=True, capture_output=True, text=True)
        self.port = free_port()
        options = ["-c", f"port={self.port}", "-c", "listen_addresses=127.0.0.1",
                   "-c", f"unix_socket_directories={self.dir}"]
        for name, value in self.settings:
            options += ["-c", f"{name}={value}"]
        self.logfile = open(self.dir / "server.log", "ab")
        self.process = subprocess.Popen(self._command(self.bindir / "postgres", "-D", data, *options),
                                        stdout=self.logfile, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the private PostgreSQL did not start:\n{(self.dir / 'server.log').read_text()[-3000:]}")
            try:
                query(self.url("postgres"), "SELECT 1")
                return self
            except (OSError, PgError):
                time.sleep(0.2)
        raise SystemExit("the private PostgreSQL did not answer within 60 s")

    def url(self, db):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    @property
    def server_url(self):
        return f"postgres://postgres@127.0.0.1:{self.port}"

    def postmaster_pid(self):
        try:
            return int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self):
        if self.process is not None:
            pid = self.postmaster_pid()
            if pid:
                try:
                    os.kill(pid, signal.SIGINT)  # fast shutdown: the postmaster this bench started
                except ProcessLookupError:
                    pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                if pid:
                    os.kill(pid, signal.SIGQUIT)
                self.process.wait(timeout=30)
            self.process = None
            self.logfile.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

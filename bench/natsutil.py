"""Just enough of the NATS protocol for the bench to ask JetStream about the bench's own stream
(its message count) and to delete it afterwards: CONNECT, SUB, PUB, MSG, PING/PONG. Requests go
to JetStream's API subjects ($JS.API.STREAM.INFO.<name>, $JS.API.STREAM.DELETE.<name>)."""

import json
import socket
import urllib.parse


class NatsError(Exception):
    pass


class Nats:
    def __init__(self, url, timeout=5.0):
        parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), timeout=timeout)
        self.reader = self.sock.makefile("rb")
        line = self.reader.readline()
        if not line.startswith(b"INFO"):
            raise NatsError(f"not a NATS server: {line[:80]!r}")
        connect = {"verbose": False, "pedantic": False, "lang": "python-bench", "version": "0",
                   "protocol": 1, "headers": True, "no_responders": True}
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        self._expect_pong()
        self.sid = 0

    def _expect_pong(self):
        while True:
            line = self.reader.readline()
            if not line:
                raise NatsError("connection closed")
            if line.startswith(b"PONG"):
                return
            if line.startswith(b"-ERR"):
                raise NatsError(line.decode().strip())

    def request(self, subject, payload=b""):
        self.sid += 1
        inbox = f"_INBOX.orderpay_bench.{self.sid}"
        self.sock.sendall(f"SUB {inbox} {self.sid}\r\nPUB {subject} {inbox} {len(payload)}\r\n".encode()
                          + payload + b"\r\n")
        while True:
            line = self.reader.readline()
            if not line:
                raise NatsError("connection closed")
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise NatsError(line.decode().strip())
            elif line.startswith(b"MSG"):
                size = int(line.split()[-1])
                body = self.reader.read(size + 2)[:size]
                self.sock.sendall(f"UNSUB {self.sid}\r\n".encode())
                return body
            elif line.startswith(b"HMSG"):
                total = int(line.split()[-1])
                block = self.reader.read(total + 2)[:total]
                self.sock.sendall(f"UNSUB {self.sid}\r\n".encode())
                status = block.split(b"\r\n", 1)[0].decode(errors="replace")
                raise NatsError(f"{subject}: {status} (is JetStream enabled?)")

    def jetstream(self, api, body=None):
        answer = json.loads(self.request(f"$JS.API.{api}", json.dumps(body).encode() if body is not None else b""))
        return answer

    def stream_info(self, stream):
        answer = self.jetstream(f"STREAM.INFO.{stream}")
        if "error" in answer:
            return None
        return answer

    def delete_stream(self, stream):
        answer = self.jetstream(f"STREAM.DELETE.{stream}")
        return answer.get("success", False)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

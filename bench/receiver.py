#!/usr/bin/env python3
"""The bench's merchant webhook endpoint: answers 200 with an empty body to every POST, over
keep-alive, and counts them (and their distinct `webhook-id`s).

    python3 bench/receiver.py PORT

It is an asyncio Protocol on raw bytes, not an HTTP framework: no header parsing beyond finding
the end of the head, the body length and the webhook id, no per-request objects, no logging.
That keeps it at a few microseconds of CPU per delivery; bench/run.py measures what it actually
took (its CPU seconds from /proc while the relays run) and reports it beside the relay figures,
since it shares the machine with the service. `GET /stats` answers the counters as JSON.
"""

import asyncio
import json
import sys
import time

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
stats = {"posts": 0, "bytes": 0, "first_at": None, "last_at": None}
ids = set()


class Receiver(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = bytearray()

    def data_received(self, data):
        buffer = self.buffer
        buffer += data
        replies = []
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buffer[:end]).lower()
            start = end + 4
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17:line_end if line_end >= 0 else len(head)])
                if len(buffer) < start + length:
                    break
                consumed = start + length
            elif b"transfer-encoding: chunked" in head:
                last = buffer.find(b"\r\n0\r\n\r\n", start - 2)
                if last < 0:
                    break
                consumed = last + 7
            else:
                consumed = start
            if head.startswith(b"get /stats"):
                body = json.dumps(stats | {"distinct_ids": len(ids)}).encode()
                replies.append(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                               + str(len(body)).encode() + b"\r\n\r\n" + body)
            else:
                now = time.time()
                stats["posts"] += 1
                stats["bytes"] += consumed - start
                stats["first_at"] = stats["first_at"] or now
                stats["last_at"] = now
                at = head.find(b"\r\nwebhook-id:")
                if at >= 0:
                    line_end = head.find(b"\r\n", at + 2)
                    ids.add(head[at + 13:line_end if line_end >= 0 else len(head)].strip())
                replies.append(OK)
            del buffer[:consumed]
        if replies:
            self.transport.write(b"".join(replies))


async def main(port):
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Receiver, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1])))
    except KeyboardInterrupt:
        pass

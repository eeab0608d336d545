#!/usr/bin/env python3
"""A worker of a nats: queue in Python, from the package documentation alone: it
subscribes to the queue's subject over the NATS client protocol (plain sockets, the
standard library only: nats-py could not be installed where this was written), checks
each order's Sluice-Delivery-Signature with verify.py, and answers a verified order with
a signed result on sluice.result.{queue}.{ticket}, which a JetStream stream of sluice's
captures. It prints one JSON line per message: {"ticket": ..., "verified": bool}.

Usage: worker.py [USER:PASSWORD@]NATS_HOST:PORT SUBJECT QUEUE DELIVERY_KEY_BASE64 COUNT
(it stops after COUNT messages). A refusal of the server (-ERR: a permission it lacks,
for example) ends it with an error.
"""
import base64
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verify import result_signature, verify_order  # noqa: E402


class Conn:
    def __init__(self, addr):
        creds, _, addr = addr.rpartition("@")
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.buf = b""
        self.pending = []
        info = self.line()
        if not info.startswith(b"INFO "):
            raise RuntimeError("not a NATS server: %r" % info)
        connect = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1, "name": "python worker"}
        if creds:
            connect["user"], _, connect["pass"] = creds.partition(":")
        self.send(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")

    def ping(self):
        """Waits for the server's PONG to a PING: everything sent before it is with the
        server, and was allowed (a refusal raises). Messages meanwhile wait in pending."""
        self.send(b"PING\r\n")
        while True:
            kind, m = self.op()
            if kind == "PONG":
                return
            self.pending.append(m)

    def send(self, b):
        self.sock.sendall(b)

    def fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("the server closed the connection")
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def take(self, n):
        while len(self.buf) < n + 2:
            self.fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def op(self):
        """Reads the next operation: ("MSG", (subject, header pairs, payload)) for a
        message, ("PONG", None); answers PINGs and raises on -ERR."""
        while True:
            line = self.line()
            op = line.split(b" ")
            if op[0] == b"PING":
                self.send(b"PONG\r\n")
            elif op[0] == b"PONG":
                return "PONG", None
            elif op[0] == b"HMSG":
                hlen, total = int(op[-2]), int(op[-1])
                raw = self.take(total)
                return "MSG", (op[1].decode(), parse_headers(raw[:hlen]), raw[hlen:])
            elif op[0] == b"MSG":
                return "MSG", (op[1].decode(), [], self.take(int(op[-1])))
            elif op[0] == b"-ERR":
                raise RuntimeError(line.decode())

    def next_msg(self):
        """The next message: (subject, header pairs, payload)."""
        while not self.pending:
            kind, m = self.op()
            if kind == "MSG":
                self.pending.append(m)
        return self.pending.pop(0)

    def hpub(self, subject, pairs, payload):
        head = b"NATS/1.0\r\n" + b"".join(n.encode() + b": " + v.encode() + b"\r\n" for n, v in pairs) + b"\r\n"
        self.send(b"HPUB %s %d %d\r\n" % (subject.encode(), len(head), len(head) + len(payload)) + head + payload + b"\r\n")


def parse_headers(raw):
    lines = raw.decode("utf-8").split("\r\n")
    if not lines[0].startswith("NATS/1.0"):
        raise RuntimeError("bad header block %r" % lines[0])
    pairs = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            pairs.append((name, value.strip(" \t")))
    return pairs


def main():
    addr, subject, queue, key_b64, count = sys.argv[1:6]
    key = base64.b64decode(key_b64)
    c = Conn(addr)
    c.send(b"SUB %s 1\r\n" % subject.encode())
    c.ping()  # connected, and subscribed
    print(json.dumps({"ready": True}), flush=True)
    for _ in range(int(count)):
        _, pairs, body = c.next_msg()
        ticket = next((v for n, v in pairs if n == "Sluice-Ticket"), "")
        ok = verify_order(key, pairs, body)
        print(json.dumps({"ticket": ticket, "verified": ok}), flush=True)
        if not ok:
            continue
        status, rbody = 201, b"python took " + body
        rheaders = [("Content-Type", "text/plain"), ("X-Receipt", "py-" + ticket[:6])]
        # Not truncated: no Sluice-Result-Truncated header (it is "true" or absent).
        reply = [("Nats-Msg-Id", "result." + ticket), ("Sluice-Result-Status", str(status))]
        reply += [("Sluice-Result-H-" + n, v) for n, v in rheaders]
        reply.append(("Sluice-Result-Signature",
                      result_signature(key, queue, ticket, status, False, rheaders, rbody)))
        c.hpub("sluice.result.%s.%s" % (queue, ticket), reply, rbody)
        c.ping()  # the result is with the server, and was allowed


if __name__ == "__main__":
    main()

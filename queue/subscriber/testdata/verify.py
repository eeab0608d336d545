#!/usr/bin/env python3
"""A worker's check of sluice's signatures, written from the package documentation of
queue/subscriber ("Signatures, byte by byte") alone, with the standard library.

Reads JSON on stdin:
  {"signing_key": hex (optional: to derive the delivery key), "queue": Q,
   "delivery_key": base64 (when no signing_key),
   "headers": [[name, value], ...]  (the delivered message's, in order),
   "body": base64,
   "result": {"status": int, "truncated": bool, "headers": [[name, value], ...], "body": base64}}
and writes JSON: {"delivery_key": hex, "verified": bool, "signature": "v1=...",
                  "result_signature": "v1=..."}.
"""
import base64
import hashlib
import hmac
import json
import struct
import sys


def mac(key, domain, *fields):
    h = hmac.new(key, digestmod=hashlib.sha256)
    for f in (domain.encode(),) + fields:
        h.update(struct.pack(">Q", len(f)))
        h.update(f)
    return h.digest()


def sig(digest):
    return "v1=" + base64.b64encode(digest).decode()


def header_fields(pairs, prefix):
    by_name = {}
    for name, value in pairs:
        if name.startswith(prefix) and len(name) > len(prefix):
            by_name.setdefault(name[len(prefix):].encode(), []).append(value.encode())
    fields = [struct.pack(">Q", len(by_name))]
    for name in sorted(by_name):
        values = by_name[name]
        fields += [name, struct.pack(">Q", len(values))] + values
    return fields


def order_signature(key, pairs, body):
    """The Sluice-Delivery-Signature of a delivered message: its headers as (name,
    value) pairs in the order received, and its data."""
    first = {}
    for name, value in pairs:
        first.setdefault(name, value)
    get = lambda name, absent="": first.get(name, absent).encode()
    fields = [get("Sluice-Ticket"), get("Sluice-Queue"), get("Sluice-Rule"), get("Sluice-Method"),
              get("Sluice-Path"), get("Sluice-Query"), get("Sluice-Received-At", "0001-01-01T00:00:00Z"),
              get("Sluice-Client"), get("Sluice-Idempotency-Key"), get("Sluice-Fingerprint")]
    fields += header_fields(pairs, "Sluice-H-")
    fields.append(body)
    return sig(mac(key, "sluice delivery", *fields))


def verify_order(key, pairs, body):
    got = next((v for n, v in pairs if n == "Sluice-Delivery-Signature"), "")
    return hmac.compare_digest(order_signature(key, pairs, body), got)


def result_signature(key, queue, ticket, status, truncated, headers, body):
    """The Sluice-Result-Signature of a result: headers as (name, value) pairs."""
    rf = [queue.encode(), ticket.encode(), str(status).encode(), b"true" if truncated else b"false"]
    rf += header_fields([["H-" + n, v] for n, v in headers], "H-")
    rf.append(body)
    return sig(mac(key, "sluice result", *rf))


def main():
    req = json.load(sys.stdin)
    queue = req["queue"]
    if "signing_key" in req:
        key = mac(bytes.fromhex(req["signing_key"]), "sluice delivery key", queue.encode())
    else:
        key = base64.b64decode(req["delivery_key"])
    pairs, body = req["headers"], base64.b64decode(req["body"])
    out = {"delivery_key": key.hex(), "signature": order_signature(key, pairs, body),
           "verified": verify_order(key, pairs, body)}
    if "result" in req:
        r = req["result"]
        ticket = next((v for n, v in pairs if n == "Sluice-Ticket"), "")
        out["result_signature"] = result_signature(key, queue, ticket, r["status"], r["truncated"], r["headers"],
                                                   base64.b64decode(r["body"]))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

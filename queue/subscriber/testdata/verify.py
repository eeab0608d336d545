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


def main():
    req = json.load(sys.stdin)
    queue = req["queue"]
    if "signing_key" in req:
        key = mac(bytes.fromhex(req["signing_key"]), "sluice delivery key", queue.encode())
    else:
        key = base64.b64decode(req["delivery_key"])
    pairs = req["headers"]
    first = {}
    for name, value in pairs:
        first.setdefault(name, value)
    get = lambda name, absent="": first.get(name, absent).encode()
    fields = [get("Sluice-Ticket"), get("Sluice-Queue"), get("Sluice-Rule"), get("Sluice-Method"),
              get("Sluice-Path"), get("Sluice-Query"), get("Sluice-Received-At", "0001-01-01T00:00:00Z"),
              get("Sluice-Client"), get("Sluice-Idempotency-Key"), get("Sluice-Fingerprint")]
    fields += header_fields(pairs, "Sluice-H-")
    fields.append(base64.b64decode(req["body"]))
    want = sig(mac(key, "sluice delivery", *fields))
    out = {"delivery_key": key.hex(), "signature": want,
           "verified": hmac.compare_digest(want, first.get("Sluice-Delivery-Signature", ""))}
    if "result" in req:
        r = req["result"]
        rf = [queue.encode(), get("Sluice-Ticket"), str(r["status"]).encode(),
              b"true" if r["truncated"] else b"false"]
        rf += header_fields([["H-" + n, v] for n, v in r["headers"]], "H-")
        rf.append(base64.b64decode(r["body"]))
        out["result_signature"] = sig(mac(key, "sluice result", *rf))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

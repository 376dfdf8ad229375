#!/usr/bin/python3
"""A stranger on the cluster network: probes strata's TCP listeners the way another user's process
could, and reports what came back. Used by tests/cluster/stranger_test.sh (issue 18).

  stranger.py --targets IP:PORT[,IP:PORT...] --hold-file PATH --report PATH [--active-done-file PATH]

Probes, against every target:
  old_hello_get     the pre-handshake 8-byte hello + a GET of 4096 bytes of region 0
  hello_put_nan     a well-formed Hello (made-up rank), then a PUT of 802,816 bytes of NaN + FLUSH
  inbox_put         a Hello, then a PUT of a row count of 1 and a row index of 2^40, then an accumulate
  bad_type          a Hello, then an accumulate with element type 7
  random_64         64 random bytes
  scan              connect + close
  wrong_secret      the whole handshake with a key of its own (a wrong proof)
  huge_requests     GET 2^62 bytes, region 99, offset 2^40, op 77, GET_ROWS of 2^59 rows
  flood             1,100 connections with a valid-looking Hello
  idle, half_header held open (idle / 20 bytes of a header) until --hold-file exists or 120 s
    (--active-done-file, when given, is created once every other probe has run)
The probes of each target run on a thread of their own, all targets at once.
Every byte received is counted. The only bytes a listener may send a stranger are the 64-byte
Challenge of the handshake (a server nonce and an HMAC over it): `leaked` counts everything else.
The report is JSON: {"probes": {name: {"received": n, "leaked": n}}, "leaked_total": n,
"errors": [probes that could not connect]}.
"""
import argparse
import json
import os
import resource
import socket
import struct
import time

MAGIC_V2 = 0x32545453  # "STT2"
OLD_HELLO = 0x53545443  # "STTC"
CHALLENGE_BYTES = 64


def request(op, region, offset, a, b):
    return struct.pack("<IIQQQ", op, region, offset, a, b)


def hello(rank, purpose=1, version=1, magic=MAGIC_V2):
    return struct.pack("<IIII", magic, version, rank, purpose) + os.urandom(32)


def drain(sock, seconds):
    """Reads until EOF, an error or `seconds`; returns the bytes."""
    got = b""
    end = time.time() + seconds
    sock.settimeout(0.2)
    while time.time() < end:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def connect(target):
    host, port = target.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def send_quietly(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass  # the listener closed on us: what it should do


def probe(target, payload, wait=2.0, handshake=False):
    """Sends payload, returns (received, leaked). With handshake=True the first 64 bytes (the
    Challenge) are the listener's due and not counted as leaked."""
    s = connect(target)
    send_quietly(s, payload)
    got = drain(s, wait)
    s.close()
    allowed = CHALLENGE_BYTES if handshake else 0
    return len(got), max(0, len(got) - allowed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", required=True)
    ap.add_argument("--hold-file", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--active-done-file")
    args = ap.parse_args()
    targets = args.targets.split(",")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))

    report = {}

    def note(name, received, leaked):
        r = report.setdefault(name, {"received": 0, "leaked": 0})
        r["received"] += received
        r["leaked"] += leaked

    held = []
    for t in targets:
        # Held open from the start: an idle connection and half a request header.
        held.append(connect(t))
        h = connect(t)
        send_quietly(h, request(1, 0, 0, 4096, 0)[:20])
        held.append(h)

    import threading
    lock = threading.Lock()
    errors = []

    def run_probes(t):
        def guarded(name, fn):
            try:
                r = fn()
            except OSError as e:  # refused / reset while connecting: the job may be gone
                with lock:
                    errors.append("%s %s: %s" % (t, name, e))
                return
            with lock:
                note(name, *r)

        guarded("old_hello_get", lambda: probe(t, struct.pack("<II", OLD_HELLO, 1) + request(1, 0, 0, 4096, 0)))
        nan = struct.pack("<f", float("nan")) * (802816 // 4)
        guarded("hello_put_nan", lambda: probe(
            t, hello(1) + request(2, 0, 0, len(nan), 0) + nan + request(8, 0, 0, 0, 0), handshake=True))
        guarded("inbox_put", lambda: probe(t, hello(1) + request(2, 0, 1024, 16, 0) + struct.pack("<qq", 1, 1 << 40) +
                                           request(3, 0, 0, 8, 2) + struct.pack("<q", 1), handshake=True))
        guarded("bad_type", lambda: probe(t, hello(1) + request(3, 0, 0, 16, 7) + bytes(16), handshake=True))
        guarded("random_64", lambda: probe(t, os.urandom(64)))

        def scan():
            connect(t).close()
            return 0, 0
        guarded("scan", scan)

        def wrong_secret(claim):
            # The whole handshake with a key of its own: the Hello is fine, the proof is not.
            s = connect(t)
            send_quietly(s, hello(claim))
            challenge = drain(s, 1.0)
            send_quietly(s, os.urandom(32))
            rest = drain(s, 2.0)
            s.close()
            return len(challenge) + len(rest), max(0, len(challenge) - CHALLENGE_BYTES) + len(rest)
        # Ranks 0 and 1: whichever the target is, one of the two is a peer it will challenge.
        guarded("wrong_secret", lambda: wrong_secret(0))
        guarded("wrong_secret", lambda: wrong_secret(1))
        for req in (request(1, 0, 0, 1 << 62, 0), request(1, 99, 0, 8, 0), request(1, 0, 1 << 40, 8, 0),
                    request(77, 0, 0, 0, 0), request(4, 0, 0, 4, 1 << 59)):
            guarded("huge_requests", lambda req=req: probe(t, hello(1) + req, wait=1.0, handshake=True))

    threads = [threading.Thread(target=run_probes, args=(t,)) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()

    # The flood: 1,100 connections, each with a valid-looking Hello, opened as fast as possible.
    flood = []
    for i in range(1100):
        t = targets[i % len(targets)]
        try:
            s = connect(t)
            send_quietly(s, hello(1 + i % 2))
            flood.append(s)
        except OSError:
            pass
    received = 0
    for s in flood:
        try:
            s.setblocking(False)
            data = s.recv(4096)
            received += len(data)
        except OSError:
            pass
        s.close()
    # Each may get its Challenge (64 bytes), never more.
    note("flood", received, max(0, received - CHALLENGE_BYTES * len(flood)))
    if args.active_done_file:
        open(args.active_done_file, "w").close()

    deadline = time.time() + 120
    while not os.path.exists(args.hold_file) and time.time() < deadline:
        time.sleep(0.2)
    for s in held:
        got = drain(s, 0.1)
        note("idle_and_half_header", len(got), len(got))
        s.close()

    total = sum(r["leaked"] for r in report.values())
    with open(args.report, "w") as f:
        json.dump({"probes": report, "leaked_total": total, "errors": errors}, f, indent=1)
    print("stranger: %d probes, %d bytes leaked" % (len(report), total))


if __name__ == "__main__":
    main()

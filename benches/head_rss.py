#!/usr/bin/env python3
"""Peak memory of `arbor serve` under unfinished, oversized request heads (issue 33, item 4).

    cargo build --release
    benches/head_rss.py [--connections 3000] [--head-kb 400] [--hold 5] \
                        [--binary target/release/arbor] [--port 18712] \
                        [--header-read-timeout 60s]

Starts `arbor serve` (the binary given, default the release build) with
tests/fixtures/serve.toml on a scratch store and a token, on a loopback port,
with `header_read_timeout` raised to 60 s (--header-read-timeout) so that no
head is closed for its slowness while the others are still being connected.
Opens CONNECTIONS connections (in batches of 200); on each, sends a request
line and one header of HEAD_KB KB, never the blank line that ends the head,
and no token.
Keeps them open for HOLD seconds once every byte is sent (or the server has
closed the connection), then closes them. Reads the server's peak RSS
(VmHWM of /proc/PID/status: the high-water mark over its whole life) and
prints it with the RSS at start, how many connections were answered 431 and
how many the server closed. Loopback only; the whole run is bounded by
--deadline seconds.
"""

import argparse
import errno
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "bench-token"


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


class Conn:
    """One connection: bytes sent, what the server answered, whether it closed."""

    def __init__(self):
        self.sent = 0
        self.answer = b""
        self.closed = False
        self.done = False

    def receive(self, s):
        try:
            got = s.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            got = b""
        if got:
            self.answer += got
        else:
            self.closed = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--head-kb", type=int, default=400)
    ap.add_argument("--hold", type=float, default=5.0, help="seconds to hold once all is sent")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds the whole run may take")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/arbor"))
    ap.add_argument("--port", type=int, default=18712)
    ap.add_argument("--header-read-timeout", default="60s", help="[service] header_read_timeout of the server")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.connections + 64
    if soft < need:
        if hard < need:
            sys.exit(f"open-files hard limit {hard} is below the {need} needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    scratch = tempfile.mkdtemp(prefix="arbor-head-rss-")
    # The fixture, with the header read timeout raised: connecting 3000 takes
    # seconds (a full accept queue drops a SYN, retried a second later), and
    # the default 10 s would close the first heads before the last are sent.
    with open(os.path.join(ROOT, "tests/fixtures/serve.toml")) as f:
        fixture = f.read()
    marker = "[service]\n"
    assert marker in fixture
    with open(os.path.join(scratch, "serve.toml"), "w") as f:
        f.write(fixture.replace(marker, f'{marker}header_read_timeout = "{args.header_read_timeout}"\n', 1))
    env = dict(os.environ, ARBOR_API_TOKENS=TOKEN, RUST_LOG="warn")
    server = subprocess.Popen(
        [args.binary, "serve", "--config", "serve.toml", "--bind", f"127.0.0.1:{args.port}"],
        cwd=scratch,
        env=env,
    )
    base = f"http://127.0.0.1:{args.port}"
    socks = []
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit("the server did not answer /healthz")
        time.sleep(0.5)
        start = status_kb(server.pid, "VmRSS")
        t0 = time.monotonic()
        end = t0 + args.deadline

        head = b"GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: "
        pad = b"a" * (args.head_kb * 1024 - len(head))
        payload = head + pad  # no CRLF: the head never ends

        sel = selectors.DefaultSelector()
        conns = {}
        left = {"sending": 0, "peak": start}

        def pump(until, stop_when_sent):
            """Sends the head and reads answers on every connection, until
            `until` (or, if `stop_when_sent`, until every head is sent)."""
            while time.monotonic() < until:
                if stop_when_sent and not left["sending"]:
                    return
                for key, events in sel.select(timeout=0.02):
                    s, c = key.fileobj, conns[key.fileobj]
                    if events & selectors.EVENT_READ:
                        c.receive(s)
                    if not c.closed and events & selectors.EVENT_WRITE and c.sent < len(payload):
                        try:
                            c.sent += s.send(payload[c.sent:c.sent + 65536])
                        except (BlockingIOError, InterruptedError):
                            pass
                        except OSError as e:
                            if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                                raise
                            # Closed by the server: its answer may be queued still.
                            c.receive(s)
                            c.closed = True
                    if c.closed:
                        sel.unregister(s)
                    elif c.sent >= len(payload) and events & selectors.EVENT_WRITE:
                        sel.modify(s, selectors.EVENT_READ)
                    if (c.closed or c.sent >= len(payload)) and not c.done:
                        c.done = True
                        left["sending"] -= 1
                left["peak"] = max(left["peak"], status_kb(server.pid, "VmRSS"))

        # Connected in batches, each given time to be accepted (a full accept
        # queue drops a SYN, and its retry waits a second); each sends as
        # soon as it is connected.
        for n in range(args.connections):
            s = socket.create_connection(("127.0.0.1", args.port), timeout=30)
            s.setblocking(False)
            socks.append(s)
            conns[s] = Conn()
            left["sending"] += 1
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
            if n % 200 == 199:
                pump(time.monotonic() + 0.05, False)
            if time.monotonic() > end:
                sys.exit(f"only {n + 1} connections within --deadline {args.deadline:g} s")
        connected = time.monotonic() - t0
        pump(end, True)
        sent_all = time.monotonic() - t0
        # Hold: read what answers and closes come meanwhile.
        pump(min(time.monotonic() + args.hold, end), False)
        peak_seen = left["peak"]
        peak = status_kb(server.pid, "VmHWM")
        answered = sum(1 for c in conns.values() if c.answer.startswith(b"HTTP/1.1 431"))
        closed = sum(1 for c in conns.values() if c.closed)
        for s in socks:
            s.close()
        socks = []
        time.sleep(1.0)
        after = status_kb(server.pid, "VmRSS")
        print(f"connections {args.connections}, head {args.head_kb} KB each (unfinished, no token)")
        print(f"  rss at start:   {start / 1024:8.1f} MB")
        print(f"  peak rss:       {peak / 1024:8.1f} MB  (VmHWM; sampled max {peak_seen / 1024:.1f} MB)")
        print(f"  rss after close:{after / 1024:8.1f} MB")
        print(f"  answered 431:   {answered}, closed by the server: {closed}; connecting took {connected:.1f} s, sending {sent_all - connected:.1f} s")
    finally:
        for s in socks:
            s.close()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The service's memory after waves of trees (issue 12, defect 15), and
after reading them back (issue 33).

    cargo build --release
    benches/serve_rss.py [--waves 5] [--trees 300] [--agent coordinator] [--clients 300] \
                         [--read-waves 0] [--binary target/release/arbor] [--settle 10]

Starts `arbor serve` (the binary given, default the release build) with
tests/fixtures/serve.toml on a scratch store and a token, then WAVES times:
POSTs TREES trees of AGENT at once (CLIENTS client threads, default 300), waits until the
server runs none (`arbor_trees_running` of /metrics is 0 and no agent is
live), and reads the server's VmRSS from /proc/PID/status. After the last
wave it waits SETTLE seconds and reads it again. Prints one line per reading,
in MB and as a ratio to the RSS at start (read once the server answers
/healthz, before any tree). Every started tree must end completed.

With --read-waves N it then reads the trees back N times: each read wave
GETs /v1/trees/{id} of TREES started trees at once (CLIENTS threads), and
prints the idle RSS a second after it, with the most threads the server had
during the wave and the number it has idle (/proc/PID/task). The last
reading (after SETTLE seconds) is then the idle RSS after the read-back.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "bench-token"


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def server_pid(parent, binary):
    """The server under a wrapper: the descendant of `parent` that runs `binary`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
        except OSError:
            continue
        if os.path.realpath(exe) == os.path.realpath(binary) and int(entry) != parent:
            return int(entry)
    return parent


def request(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def rss_split_kb(pid):
    """The RSS's anonymous and file-backed parts (/proc/PID/smaps_rollup)."""
    split = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("Rss", "Anonymous"):
                split[key] = int(line.split()[1])
    return split["Anonymous"], split["Rss"] - split["Anonymous"]


def task_count(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def metric(text, name):
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--waves", type=int, default=5)
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--agent", default="coordinator")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/arbor"))
    ap.add_argument("--clients", type=int, default=300, help="client threads posting a wave")
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--read-waves", type=int, default=0, help="times to read TREES trees back")
    ap.add_argument("--port", type=int, default=18711)
    ap.add_argument("--wrap", default="", help="a command to run the server under (heaptrack)")
    args = ap.parse_args()

    scratch = tempfile.mkdtemp(prefix="arbor-rss-")
    shutil.copy(os.path.join(ROOT, "tests/fixtures/serve.toml"), scratch)
    env = dict(os.environ, ARBOR_API_TOKENS=TOKEN, RUST_LOG="warn")
    server = subprocess.Popen(
        args.wrap.split() + [args.binary, "serve", "--config", "serve.toml", "--bind", f"127.0.0.1:{args.port}"],
        cwd=scratch,
        env=env,
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.5)
        pid = server_pid(server.pid, args.binary) if args.wrap else server.pid
        start = rss_kb(pid)

        def show(label, kb):
            print(f"{label:>14}: {kb / 1024:7.1f} MB  {kb / start:5.2f}x", flush=True)

        show("start", start)
        anon, file = rss_split_kb(pid)
        print(f"{'':>14}  ({task_count(pid)} threads; {anon / 1024:.1f} MB anonymous, {file / 1024:.1f} MB file-backed)", flush=True)
        started_total = 0
        tree_ids = []
        for wave in range(1, args.waves + 1):
            t0 = time.monotonic()
            errors = []
            lock = threading.Lock()
            todo = list(range(args.trees))

            def worker():
                while True:
                    with lock:
                        if not todo:
                            return
                        todo.pop()
                    try:
                        started = request(base, "POST", "/v1/runs", {"agent": args.agent, "prompt": "wave"})
                        with lock:
                            tree_ids.append(json.loads(started)["treeId"])
                    except Exception as e:  # noqa: BLE001
                        with lock:
                            errors.append(str(e))

            threads = [threading.Thread(target=worker) for _ in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                sys.exit(f"wave {wave}: {len(errors)} starts failed: {errors[0]}")
            started_total += args.trees
            peak = 0
            while True:
                peak = max(peak, rss_kb(pid))
                m = request(base, "GET", "/metrics")
                if metric(m, "arbor_trees_running") == 0 and metric(m, "arbor_live_agents") == 0:
                    break
                time.sleep(0.2)
            time.sleep(1.0)
            show(f"wave {wave} idle", rss_kb(pid))
            print(f"{'':>14}  (peak {peak / 1024:.1f} MB, {time.monotonic() - t0:.1f} s)", flush=True)
        for wave in range(1, args.read_waves + 1):
            # The latest TREES trees, each read once, all at once.
            todo = tree_ids[-args.trees:]
            errors = []
            lock = threading.Lock()
            done = threading.Event()

            def reader():
                while True:
                    with lock:
                        if not todo:
                            return
                        tree = todo.pop()
                    try:
                        request(base, "GET", f"/v1/trees/{tree}")
                    except Exception as e:  # noqa: BLE001
                        with lock:
                            errors.append(str(e))

            most = [task_count(pid)]

            def count():
                while not done.is_set():
                    most[0] = max(most[0], task_count(pid))
                    time.sleep(0.05)

            counter = threading.Thread(target=count)
            counter.start()
            t0 = time.monotonic()
            readers = [threading.Thread(target=reader) for _ in range(args.clients)]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            done.set()
            counter.join()
            if errors:
                sys.exit(f"read wave {wave}: {len(errors)} reads failed: {errors[0]}")
            took = time.monotonic() - t0
            time.sleep(1.0)
            show(f"read {wave} idle", rss_kb(pid))
            print(f"{'':>14}  (threads: {most[0]} at most, {task_count(pid)} idle; {took:.1f} s)", flush=True)
        time.sleep(args.settle)
        show(f"+{args.settle:g} s idle", rss_kb(pid))
        anon, file = rss_split_kb(pid)
        print(f"{'':>14}  ({task_count(pid)} threads; {anon / 1024:.1f} MB anonymous, {file / 1024:.1f} MB file-backed)", flush=True)
        m = request(base, "GET", "/metrics")
        completed = metric(m, 'arbor_runs_finished_total{status="completed"}') or 0
        spawned = metric(m, "arbor_agents_spawned_total") or 0
        print(f"agents spawned {spawned:.0f}, completed {completed:.0f}, trees {started_total}")
        if completed != spawned:
            sys.exit("not every agent completed")
    finally:
        if args.wrap:
            # Killed while idle: heaptrack's "leaked" is then what was live.
            os.kill(server_pid(server.pid, args.binary), signal.SIGKILL)
        else:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

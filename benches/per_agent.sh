#!/usr/bin/env bash
# Per-agent cost of Arbor against honest baselines (issue 17), measured from
# outside: whole processes under /usr/bin/time, in rounds that alternate
# Arbor, the bare trees and LangGraph on the same tree (fanout 10, depth 4 =
# 11,111 agents, a 100-message inherited history). Every figure is a median
# over the rounds of a ratio taken within one round, so a machine that changes
# speed between rounds moves both sides of a ratio alike.
#
# Usage: benches/per_agent.sh [options]   (needs python3)
#   --rounds N         rounds (default 5; at least 1)
#   --quick            3 rounds at depth 3 (1,111 agents)
#   --depth D          tree depth (default 4)
#   --no-langgraph     leave LangGraph out (it needs Python 3 and PyPI once)
#   --langgraph-depth D  LangGraph's depth if not the tree's (compared per agent)
#   --big              also the 1.1 M-agent tree (fanout 10, depth 6,
#                      --max-live 10000) each round: RSS and CPU per agent vs 11k
#   --llm              also the LLM-bound rate: 10,000 children at 50 ms
#                      simulated latency, --max-live 100, 1000 and 10000,
#                      beside the bare ractor tree paced alike (its steps
#                      wait the latency in the same live slots)
#   --store            also Arbor's tree written to a SQLite store each round:
#                      its wall time against the same tree's --no-store run
#   --http             also the loopback HTTP rate: 10,000 agents answering on
#                      a mock OpenAI-compatible endpoint with 50 ms latency at
#                      concurrency 1,000 (`arbor loadtest --model`, --shape
#                      10000 --max-live 1001: the root and 1,000 children),
#                      against a bare reqwest client and Arbor's provider
#                      client alone, each sending 10,000 requests of the same
#                      size from 1,000 tasks (benches/http/endpoint.rs). The
#                      rate is the endpoint's: requests ÷ (last reply − first
#                      arrival), read from the mock server, the same for all
#                      three; CPU per request is the client process's
#   --keep DIR         keep the raw measurements (TSV, JSON) in DIR
#   --arbor BIN        time BIN as Arbor instead of building target/release/arbor
#                      (nothing is built then, unless --http needs its endpoint)
#   --vs BIN           also time a second arbor binary (e.g. a build of an older
#                      commit) on the same tree in the same rounds: Arbor and BIN
#                      run back to back, Arbor first in odd rounds and BIN first
#                      in even ones; BIN is the table's `vs` row, and the per-round
#                      ratios Arbor/BIN of CPU per agent and of peak RSS are
#                      printed with their medians (below 1: Arbor costs less)
#   --no-warmup        no warm-up round
#
# Each round runs Arbor (`arbor loadtest --no-store`, and BIN's with --vs), the
# bare trees `shared`, `none`, `tokio` (`arbor loadtest --baseline-only
# --baseline-kind K`: the process runs only the bare tree), LangGraph
# (benches/langgraph_tree.py, in a virtualenv under target/bench-venv with the
# version pinned in benches/requirements-langgraph.txt), and a process that
# runs a one-node tree (`--depth 0`): what starting and ending the binary
# costs, which the "net" columns subtract. The order rotates by one each round
# (round 1 starts with Arbor, round 2 with the next, ...): the first process of
# a round runs on a colder machine (issue 39), and rotating spreads that over
# every kind. Before round 1, a warm-up round runs each process once,
# unmeasured.
#
# CPU is user + system of the whole process for Arbor and the bare trees: the
# child's rusage, as /usr/bin/time reports it, but read to the microsecond
# (wait4; /usr/bin/time prints hundredths, too coarse for a 0.1 s bare tree); LangGraph's is its own process's CPU from building its graphs to
# the end of the run (importing LangGraph excluded, which favours it). Memory
# per live agent is (peak RSS − RSS before the tree) ÷ the most agents alive at
# once (both from the load test's JSON report; peak RSS from /usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5 depth=4 langgraph=1 lg_depth="" big=0 llm=0 store=0 http=0 keep="" arbor="" vs="" warmup=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    --quick) rounds=3 depth=3 ;;
    --depth) depth=${2:?--depth needs a number}; shift ;;
    --no-langgraph) langgraph=0 ;;
    --langgraph-depth) lg_depth=${2:?--langgraph-depth needs a number}; shift ;;
    --big) big=1 ;;
    --llm) llm=1 ;;
    --store) store=1 ;;
    --keep) keep=${2:?--keep needs a directory}; shift ;;
    --http) http=1 ;;
    --arbor) arbor=${2:?--arbor needs a binary}; shift ;;
    --vs) vs=${2:?--vs needs a binary}; shift ;;
    --no-warmup) warmup=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "per_agent.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$rounds$depth${lg_depth:-0}" in
  *[!0-9]*) echo "per_agent.sh: --rounds, --depth and --langgraph-depth take whole numbers" >&2; exit 2 ;;
esac
[ "$rounds" -ge 1 ] || { echo "per_agent.sh: --rounds must be at least 1" >&2; exit 2; }
lg_depth=${lg_depth:-$depth}
command -v python3 > /dev/null || { echo "per_agent.sh: needs python3" >&2; exit 2; }

for b in "$arbor" "$vs"; do
  [ -z "$b" ] || [ -x "$b" ] || { echo "per_agent.sh: $b is not an executable" >&2; exit 2; }
done
if [ -n "$arbor" ]; then
  bin=$arbor
else
  cargo build --release --quiet --bin arbor
  bin=target/release/arbor
fi
if [ "$http" = 1 ]; then
  cargo build --release --quiet --example http_endpoint
  endpoint=target/release/examples/http_endpoint
fi
venv=target/bench-venv
if [ "$langgraph" = 1 ]; then
  if ! "$venv/bin/python" -c 'import langgraph' 2>/dev/null; then
    echo "installing LangGraph into $venv (benches/requirements-langgraph.txt)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r benches/requirements-langgraph.txt
  fi
  lg_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("langgraph"))')
fi

work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
tsv="$work/runs.tsv"
: > "$tsv"
# timed OUT CMD...: runs CMD and writes its user s, system s, max RSS (KB) and
# wall s to OUT (what `/usr/bin/time -f '%U %S %M %e'` writes, to the µs).
cat > "$work/timed.py" <<'PY'
import os, subprocess, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
wall = time.perf_counter() - start
with open(out, "w") as f:
    f.write(f"{usage.ru_utime:.6f} {usage.ru_stime:.6f} {usage.ru_maxrss} {wall:.6f}\n")
sys.exit(os.waitstatus_to_exitcode(status))
PY
tree=(--fanout 10 --depth "$depth" --history 100)

if [ "$http" = 1 ]; then
  "$endpoint" serve --latency-ms 50 > "$work/endpoint.url" 2> "$work/endpoint.err" &
  endpoint_pid=$!
  trap 'kill $endpoint_pid 2>/dev/null || true; [ -n "$keep" ] || rm -rf "$work"' EXIT
  for _ in $(seq 100); do [ -s "$work/endpoint.url" ] && break; sleep 0.1; done
  url=$(head -1 "$work/endpoint.url")
  [ -n "$url" ] || { echo "per_agent.sh: the mock endpoint did not start:" >&2; cat "$work/endpoint.err" >&2; exit 1; }
  stats=${url%/v1}/stats
  # The endpoint's counters: reset before a client runs, saved (JSON) after.
  stats_reset() { python3 -c "import urllib.request as u; u.urlopen(u.Request('$stats/reset', method='POST'))"; }
  stats_save() { python3 -c "import urllib.request as u; print(u.urlopen('$stats').read().decode())" > "$1"; }
  printf '[models.bench]\nprovider = "openai"\nbase_url = "%s"\nmodel = "m"\nstream = false\n' "$url" > "$work/http.toml"
fi

# measure ROUND NAME JSON-KIND CMD...: runs CMD, timed, with its
# JSON report in $work, and appends a row to the TSV (round 0, the warm-up:
# none).
measure() {
  local round=$1 name=$2 kind=$3; shift 3
  local json="$work/$name-$round.json" tfile="$work/time"
  if ! python3 "$work/timed.py" "$tfile" "$@" > "$work/$name-$round.out" 2> "$work/$name-$round.err"; then
    echo "per_agent.sh: $name failed in round $round:" >&2
    tail -5 "$work/$name-$round.err" >&2
    exit 1
  fi
  if [ "$kind" = langgraph ]; then
    tail -1 "$work/$name-$round.out" > "$json"
  fi
  read -r user sys maxrss wall < "$tfile"
  if [ "$round" = 0 ]; then
    echo "  warm-up: $name  user $user s, sys $sys s, max RSS $((maxrss / 1024)) MB, wall $wall s" >&2
    return
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$kind" "$user" "$sys" "$maxrss" "$json" >> "$tsv"
  echo "  round $round: $name  user $user s, sys $sys s, max RSS $((maxrss / 1024)) MB, wall $wall s" >&2
}

# What a round runs, in units whose order rotates between rounds (a unit
# keeps its own order: HTTP's clients need Arbor's body size first).
units=(arbor bare-shared bare-none bare-tokio)
[ "$langgraph" = 0 ] || units+=(langgraph)
units+=(startup)
[ "$big" = 0 ] || units+=(big)
[ "$store" = 0 ] || units+=(store)
[ "$http" = 0 ] || units+=(http)
[ "$llm" = 0 ] || units+=(llm-100 llm-1000 llm-10000)

# unit ROUND NAME: runs one unit of round ROUND (0: the warm-up).
unit() {
  local round=$1
  case "$2" in
    arbor)
      local arbor_run=(measure "$round" arbor arbor "$bin" loadtest "${tree[@]}" --no-store
        --json "$work/arbor-$round.json")
      if [ -z "$vs" ]; then
        "${arbor_run[@]}"
      else
        local vs_run=(measure "$round" vs arbor "$vs" loadtest "${tree[@]}" --no-store
          --json "$work/vs-$round.json")
        if [ $((round % 2)) = 1 ]; then
          "${arbor_run[@]}"; "${vs_run[@]}"
        else
          "${vs_run[@]}"; "${arbor_run[@]}"
        fi
      fi ;;
    bare-*)
      local k=${2#bare-}
      measure "$round" "bare-$k" bare "$bin" loadtest "${tree[@]}" --baseline-only --baseline-kind "$k" \
        --json "$work/bare-$k-$round.json" ;;
    langgraph)
      measure "$round" langgraph langgraph "$venv/bin/python" benches/langgraph_tree.py \
        --fanout 10 --depth "$lg_depth" --history 100 ;;
    startup)
      measure "$round" startup bare "$bin" loadtest --depth 0 --baseline-only --baseline-kind none \
        --json "$work/startup-$round.json" ;;
    big)
      measure "$round" arbor-1.1M arbor "$bin" loadtest --fanout 10 --depth 6 --history 100 \
        --max-live 10000 --no-store --json "$work/arbor-1.1M-$round.json" ;;
    store)
      measure "$round" arbor-store arbor "$bin" loadtest "${tree[@]}" --store "$work/store-$round.db" \
        --json "$work/arbor-store-$round.json"
      rm -f "$work/store-$round.db" "$work/store-$round.db-wal" "$work/store-$round.db-shm" ;;
    http)
      # Arbor first: the clients then send bodies of its children's size.
      stats_reset
      measure "$round" http-arbor http "$bin" loadtest --model bench --config "$work/http.toml" \
        --shape 10000 --max-live 1001 --no-store --json "$work/http-arbor-$round.report.json"
      stats_save "$work/http-arbor-$round.json"
      local size client
      size=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['medianBodyBytes'])" "$work/http-arbor-$round.json")
      for client in bare provider; do
        stats_reset
        measure "$round" "http-$client" http "$endpoint" "$client" --url "$url" --concurrency 1000 \
          --requests 10000 --body-bytes "$size"
        stats_save "$work/http-$client-$round.json"
      done ;;
    llm-*)
      local m=${2#llm-}
      measure "$round" "llm-$m" arbor "$bin" loadtest --shape 10000 --latency 50ms --max-live "$m" \
        --no-store --json "$work/llm-$m-$round.json"
      # The bare ractor tree on the same shape, latency and cap: what any
      # runtime reaches on this machine.
      measure "$round" "llm-bare-$m" bare "$bin" loadtest --shape 10000 --latency 50ms --max-live "$m" \
        --baseline-only --baseline-kind shared --json "$work/llm-bare-$m-$round.json" ;;
  esac
}

first=1
[ "$warmup" = 0 ] || first=0
for round in $(seq "$first" "$rounds"); do
  n=${#units[@]}
  turn=$(( round > 0 ? (round - 1) % n : 0 ))
  for i in $(seq 0 $((n - 1))); do
    unit "$round" "${units[$(( (i + turn) % n ))]}"
  done
done

python3 - "$tsv" "$depth" "$lg_depth" "${lg_version:-}" "$vs" <<'EOF'
import json, statistics, sys
from collections import defaultdict

tsv, depth, lg_depth, lg_version, vs = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                        sys.argv[4], sys.argv[5])
runs = defaultdict(dict)  # round -> name -> figures
for line in open(tsv):
    rnd, name, kind, user, sys_, maxrss, path = line.rstrip("\n").split("\t")
    report = json.load(open(path))
    cpu = float(user) + float(sys_)
    fig = {"cpu": cpu, "peak": int(maxrss) * 1024}
    if kind == "arbor":
        fig.update(agents=report["agentsStarted"], alive=report["aliveMax"],
                   before=report["rssBeforeBytes"], wall=report["wallSecs"],
                   max_live=report.get("maxLive"))
    elif kind == "bare":
        b = report["baselines"][0]
        fig.update(agents=b["nodes"], alive=b["aliveMax"], before=b["memory"]["rssBeforeBytes"],
                   wall=b["wallSecs"])
    elif kind == "http":
        # The endpoint's figures: requests and its window; CPU is the client's process.
        fig.update(requests=report["requests"], window=report["windowSecs"],
                   in_flight=report["maxInFlight"], body=report["medianBodyBytes"])
    else:
        fig.update(agents=report["agents"], inproc=report["cpuSecs"], wall=report["wallSecs"])
    runs[int(rnd)][name] = fig

med = statistics.median
rounds = sorted(runs)
def col(f):
    vals = [f(runs[r]) for r in rounds]
    return med(vals), vals

def ratio(a, b):
    return a / b if b > 0 else float("nan")

def per_agent(fig, startup=None):
    cpu = fig.get("inproc", fig["cpu"])
    if startup is not None and "inproc" not in fig:
        cpu = max(cpu - startup["cpu"], 0.0)
    return cpu * 1e6 / fig["agents"]

def live_bytes(fig):
    return (fig["peak"] - fig["before"]) / max(fig["alive"], 1)

names = [n for n in ["arbor", "vs", "bare-shared", "bare-none", "bare-tokio", "langgraph"]
         if n in runs[rounds[0]]]
agents = runs[rounds[0]]["arbor"]["agents"]
print(f"\nper-agent cost, fanout 10, depth {depth} ({agents} agents), 100-message history, "
      f"{len(rounds)} rounds; medians of within-round ratios")
if "langgraph" in names:
    lg = runs[rounds[0]]["langgraph"]["agents"]
    print(f"LangGraph {lg_version}: depth {lg_depth} ({lg} agents), its in-process CPU (imports excluded)")
if "vs" in names:
    print(f"vs: {vs}, run beside Arbor (each first in every other round)")
print()
print(f"{'tree':<14} {'CPU µs/agent':>13} {'net µs/agent':>13} {'Arbor/it CPU':>13} {'Arbor/it net':>13} "
      f"{'peak RSS MB':>12} {'B/live agent':>13} {'Arbor/it mem':>13}")
for n in names:
    c, _ = col(lambda r: per_agent(r[n]))
    net, _ = col(lambda r: per_agent(r[n], r["startup"]))
    cpu_ratio, _ = col(lambda r: ratio(per_agent(r["arbor"]), per_agent(r[n])))
    ratio_net, _ = col(lambda r: ratio(per_agent(r["arbor"], r["startup"]), per_agent(r[n], r["startup"])))
    if n == "langgraph":
        print(f"{n:<14} {c:>13.2f} {'':>13} {'':>13} {'':>13} {'':>12} {'':>13} {'':>13}")
        it_arbor, _ = col(lambda r: ratio(per_agent(r[n]), per_agent(r["arbor"])))
        it_net, _ = col(lambda r: ratio(per_agent(r[n]), per_agent(r["arbor"], r["startup"])))
        langgraph_line = (f"LangGraph/Arbor CPU per agent: {it_arbor:.0f}x "
                          f"({it_net:.0f}x against Arbor net of startup)")
        continue
    peak, _ = col(lambda r: r[n]["peak"] / 1e6)
    mem, _ = col(lambda r: live_bytes(r[n]))
    mem_ratio, _ = col(lambda r: ratio(live_bytes(r["arbor"]), live_bytes(r[n])))
    print(f"{n:<14} {c:>13.2f} {net:>13.2f} {cpu_ratio:>12.2f}x {ratio_net:>12.2f}x "
          f"{peak:>12.1f} {mem:>13.0f} {mem_ratio:>12.2f}x")
print()
if "langgraph" in names:
    print("  " + langgraph_line)
for n in names[1:]:
    if n == "vs":
        continue
    if n == "langgraph":
        _, vals = col(lambda r: ratio(per_agent(r[n]), per_agent(r["arbor"])))
        print(f"  langgraph/Arbor CPU per round: " + ", ".join(f"{v:.0f}" for v in vals))
        continue
    _, vals = col(lambda r: ratio(per_agent(r["arbor"]), per_agent(r[n])))
    print(f"  Arbor/{n} CPU per round: " + ", ".join(f"{v:.2f}" for v in vals))
if "vs" in names:
    cpu_vs, vals = col(lambda r: ratio(per_agent(r["arbor"]), per_agent(r["vs"])))
    print(f"  Arbor/vs CPU per agent: median {cpu_vs:.3f}x, per round: "
          + ", ".join(f"{v:.3f}" for v in vals))
    rss_vs, vals = col(lambda r: ratio(r["arbor"]["peak"], r["vs"]["peak"]))
    print(f"  Arbor/vs peak RSS: median {rss_vs:.3f}x, per round: "
          + ", ".join(f"{v:.3f}" for v in vals))
s, vals = col(lambda r: r["startup"]["cpu"])
print(f"  startup (a one-node run): median {s * 1e3:.0f} ms CPU")
a_alive, _ = col(lambda r: r["arbor"]["alive"])
print(f"  Arbor: at most {a_alive:.0f} agents alive (median)")

if "arbor-1.1M" in runs[rounds[0]]:
    big = runs[rounds[0]]["arbor-1.1M"]["agents"]
    c, _ = col(lambda r: per_agent(r["arbor-1.1M"]))
    big_ratio, _ = col(lambda r: ratio(per_agent(r["arbor-1.1M"]), per_agent(r["arbor"])))
    peak, _ = col(lambda r: r["arbor-1.1M"]["peak"] / 1e6)
    mem, _ = col(lambda r: live_bytes(r["arbor-1.1M"]))
    alive, _ = col(lambda r: r["arbor-1.1M"]["alive"])
    print(f"\n1.1 M tree ({big} agents, --max-live 10000): {c:.2f} µs CPU per agent, "
          f"{big_ratio:.2f}x the {agents}-agent tree's (same round); peak RSS {peak:.1f} MB, "
          f"{mem:.0f} B per live agent (at most {alive:.0f} alive)")

if "arbor-store" in runs[rounds[0]]:
    st, vals = col(lambda r: ratio(r["arbor-store"]["wall"], r["arbor"]["wall"]))
    cpu_st, _ = col(lambda r: ratio(r["arbor-store"]["cpu"], r["arbor"]["cpu"]))
    print(f"\nStore: the {agents}-agent tree written to SQLite takes {st:.2f}x the wall time of "
          f"--no-store (per round: " + ", ".join(f"{v:.2f}" for v in vals) + f"); CPU {cpu_st:.2f}x")

if "http-arbor" in runs[rounds[0]]:
    print("\nLoopback HTTP: 10,000 requests at 50 ms, concurrency 1,000; the endpoint's rate "
          "(requests / first arrival to last reply); client CPU is the whole process's")
    rate = lambda f: f["requests"] / f["window"]
    print(f"  {'client':<34} {'requests/s':>11} {'/ bare':>7} {'CPU µs/request':>15} {'most in flight':>15} {'body B':>7}")
    for n, label in [("http-bare", "bare reqwest"), ("http-provider", "Arbor's provider client alone"),
                     ("http-arbor", "arbor loadtest --model")]:
        r, _ = col(lambda x: rate(x[n]))
        rel, vals = col(lambda x: ratio(rate(x[n]), rate(x["http-bare"])))
        cpu, _ = col(lambda x: x[n]["cpu"] * 1e6 / x[n]["requests"])
        fl, _ = col(lambda x: x[n]["in_flight"])
        body, _ = col(lambda x: x[n]["body"])
        print(f"  {label:<34} {r:>11.0f} {rel:>7.2f} {cpu:>15.1f} {fl:>15.0f} {body:>7.0f}")
    _, vals = col(lambda x: ratio(rate(x["http-arbor"]), rate(x["http-bare"])))
    print("  Arbor/bare requests/s per round: " + ", ".join(f"{v:.2f}" for v in vals))

llm = [m for m in (100, 1000, 10000) if f"llm-{m}" in runs[rounds[0]]]
if llm:
    print("\nLLM-bound: 10,000 children at 50 ms, achieved agents/s vs max_live / latency; the bare\n"
          "ractor tree (shared history) takes the same steps as waits on the same shape and cap")
    print(f"  {'--max-live':>10} {'tree':<6} {'agents/s':>9} {'/ ideal':>8} {'wall s':>7} "
          f"{'floor s':>8} {'floor/wall':>10} {'Arbor/bare rate':>16}")
    # The shape's own floor: the root's first step, ceil(10000 / m) waves of
    # children, the root's last step, 50 ms each; at most 10,001 / floor
    # agents/s even for a runtime that costs nothing.
    floor_of = lambda m: 0.05 * (-(-10000 // m) + 2)
    for m in llm:
        ideal_rate = m / 0.05
        floor = floor_of(m)
        for tree, n in (("Arbor", f"llm-{m}"), ("bare", f"llm-bare-{m}")):
            if n not in runs[rounds[0]]:
                continue
            rate, _ = col(lambda r: r[n]["agents"] / r[n]["wall"])
            eff, _ = col(lambda r: floor / r[n]["wall"])
            wall, _ = col(lambda r: r[n]["wall"])
            rel = ""
            if tree == "Arbor" and f"llm-bare-{m}" in runs[rounds[0]]:
                rel, _ = col(lambda r: ratio(r[n]["agents"] / r[n]["wall"],
                                             r[f"llm-bare-{m}"]["agents"] / r[f"llm-bare-{m}"]["wall"]))
                rel = f"{rel:.2f}"
            print(f"  {m:>10} {tree:<6} {rate:>9.0f} {rate / ideal_rate:>8.2f} {wall:>7.3f} "
                  f"{floor:>8.2f} {eff:>10.2f} {rel:>16}")
    print(f"  (a zero-cost runtime reaches at most {', '.join(f'{10001 / floor_of(m) / (m / 0.05):.2f}' for m in llm)} of the ideal: the shape's floor)")
EOF

#!/usr/bin/env bash
# Load on `arbor serve` (release build) with wrk, while event streams are open.
#
#   benches/serve_load.sh [SECONDS] [CONNECTIONS] [STREAMS]
#
# Starts the server on a scratch store with tests/fixtures/serve.toml, opens
# STREAMS (default 50) SSE streams on `planner` trees (21 agents, 150 ms a
# step here: the script sets the fixture's 20 ms to 150 ms; started again as
# each ends), then runs, in this order and in one run:
#   1. baseline: wrk GET /healthz        (the server's floor: routing, no work)
#   2. wrk GET /v1/agents                (an authenticated read)
#   3. wrk POST /v1/runs {"agent":"lead"} (start a 10-agent tree on the
#      simulated model: validate, write the tree durably, spawn the root)
# each for SECONDS (default 10) with CONNECTIONS (default 200) connections on
# 2 threads, and prints wrk's requests/s and latency percentiles. Afterwards it
# checks every started tree completed and every stream ended with its root.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-200}
streams=${3:-50}
token=bench-token
port=18700

cargo build --release --quiet
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
sed 's/^latency = "20ms"$/latency = "150ms"/' tests/fixtures/serve.toml > "$dir/serve.toml"
grep -c '^latency = "150ms"$' "$dir/serve.toml" | grep -qx 3 || { echo "fixture changed: update the sed" >&2; exit 1; }
(cd "$dir" && ARBOR_API_TOKENS=$token RUST_LOG=warn \
    exec "$OLDPWD/target/release/arbor" serve --config serve.toml --bind 127.0.0.1:$port) &
base=http://127.0.0.1:$port
until curl -sf $base/healthz >/dev/null; do sleep 0.1; done
auth="Authorization: Bearer $token"

# STREAMS followers: each starts a planner tree and reads its stream to the
# end, over and over, for the whole run; each logs "ok" per finished stream.
follow() {
    while [[ ! -e "$dir/stop" ]]; do
        run=$(curl -sf -X POST $base/v1/runs -H "$auth" -H 'Content-Type: application/json' \
              -d '{"agent":"planner","prompt":"stream"}' | sed -E 's/.*"runId":"([^"]+)".*/\1/')
        last=$(curl -sfN "$base/v1/runs/${run/\//%2F}/events" -H "$auth" | grep '^event:' | tail -1)
        [[ "$last" == "event: agentFinished" ]] && echo ok >> "$dir/streams.$1" || echo "bad: $last" >> "$dir/streams.$1"
    done
}
for i in $(seq 1 "$streams"); do follow "$i" & done

cat > "$dir/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"agent":"lead","prompt":"load"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
LUA
cat > "$dir/get.lua" <<LUA
wrk.headers["Authorization"] = "Bearer $token"
LUA

echo "== baseline: GET /healthz"
wrk -t2 -c"$conns" -d"${secs}s" --latency $base/healthz | grep -E "Requests/sec|^ +(50|90|99)%|Non-2xx|Socket errors"
echo "== GET /v1/agents"
wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$dir/get.lua" $base/v1/agents | grep -E "Requests/sec|^ +(50|90|99)%|Non-2xx|Socket errors"
echo "== POST /v1/runs (10-agent trees)"
wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$dir/post.lua" $base/v1/runs | grep -E "Requests/sec|^ +(50|90|99)%|Non-2xx|Socket errors"

touch "$dir/stop"
wait_trees() {
    for _ in $(seq 1 600); do
        running=$(curl -sf "$base/v1/runs?status=running&limit=1" -H "$auth" | grep -c '"treeId"' || true)
        [[ "$running" == 0 ]] && return 0
        sleep 0.5
    done
    return 1
}
wait_trees || echo "trees still running after 5 minutes"
sleep 1
for job in $(jobs -p | tail -n +2); do wait "$job" 2>/dev/null || true; done
ok=$(cat "$dir"/streams.* 2>/dev/null | grep -c '^ok' || true)
bad=$(cat "$dir"/streams.* 2>/dev/null | grep -vc '^ok' || true)
total=$(curl -sf "$base/v1/runs?limit=1&status=completed" -H "$auth" >/dev/null; \
        curl -sf "$base/metrics" -H "$auth" | grep -E '^arbor_runs_finished_total|^arbor_agents_spawned_total')
echo "== streams ended with their root: $ok, not: $bad"
echo "$total"

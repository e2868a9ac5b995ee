#!/usr/bin/env bash
# `POST /v1/runs` throughput and p99 for 1, 2 and 3 `arbor serve` replicas on
# one Postgres database, against one replica on a SQLite file, in one run on
# one machine (release build, wrk).
#
#   ARBOR_PG_URL=postgres://user@host:port benches/replicas.sh [SECONDS] [CONNECTIONS]
#
# Each setup gets a fresh store (a new database on ARBOR_PG_URL, dropped
# after; a new SQLite file), starts its replicas with tests/fixtures/serve.toml,
# and runs one wrk per replica at once (CONNECTIONS, default 120, split
# between them; 1 thread each) for SECONDS (default 10), each POSTing a
# 10-agent `lead` tree on the simulated model. Printed: the total requests/s
# and the worst p99 of the replicas' wrk runs; then every tree is waited for
# and counted completed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-120}
: "${ARBOR_PG_URL:?start a server with eval \"\$(tests/pg/start)\" first}"
pg=${ARBOR_PG_URL%/}
token=bench-token
bin=$PWD/target/release/arbor

[[ -n "${NO_BUILD:-}" ]] || cargo build --release --quiet --bin arbor
dir=$(mktemp -d)
dbs=()
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    for db in "${dbs[@]}"; do psql "$pg/postgres" -Xq -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
cp tests/fixtures/serve.toml "$dir/serve.toml"
cat > "$dir/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"agent":"lead","prompt":"load"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
LUA

# bench NAME STORE REPLICAS
bench() {
    local name=$1 store=$2 n=$3 port base pids=() bases=()
    for i in $(seq 1 "$n"); do
        port=$((18800 + i))
        (cd "$dir" && ARBOR_API_TOKENS=$token RUST_LOG=warn \
            exec "$bin" serve --config serve.toml --store "$store" --bind 127.0.0.1:$port) &
        pids+=($!)
        bases+=("http://127.0.0.1:$port")
    done
    for base in "${bases[@]}"; do
        until curl -sf "$base/readyz" >/dev/null; do sleep 0.1; done
    done
    local each=$((conns / n)) outs=()
    for i in "${!bases[@]}"; do
        wrk -t1 -c"$each" -d"${secs}s" --latency -s "$dir/post.lua" "${bases[$i]}/v1/runs" > "$dir/wrk.$i" &
        outs+=($!)
    done
    wait "${outs[@]}"
    local rps p99
    rps=$(grep -h "Requests/sec" "$dir"/wrk.* | awk '{s += $2} END {printf "%.0f", s}')
    p99=$(grep -h "^ *99%" "$dir"/wrk.* | awk '{print $2}' | sort -h | tail -1)
    local errors
    errors=$(grep -h "Non-2xx\|Socket errors" "$dir"/wrk.* | tr '\n' ' ' || true)
    # Every tree to its end.
    for _ in $(seq 1 600); do
        running=$(curl -sf "${bases[0]}/v1/runs?status=running&limit=1" -H "Authorization: Bearer $token" | grep -c '"treeId"' || true)
        [[ "$running" == 0 ]] && break
        sleep 0.5
    done
    completed=$("$bin" runs --store "$store" --status completed --limit 0 --json | grep -o '"treeId"' | wc -l)
    printf '%-22s %8s req/s   p99 %-9s  trees completed %s %s\n' "$name" "$rps" "$p99" "$completed" "$errors"
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    rm -f "$dir"/wrk.*
}

bench "sqlite, 1 replica" "$dir/bench.db" 1
for n in 1 2 3; do
    db=arbor_bench_$$_$n
    psql "$pg/postgres" -Xq -c "CREATE DATABASE $db" >/dev/null
    dbs+=("$db")
    bench "postgres, $n replica(s)" "$pg/$db" "$n"
done

#!/usr/bin/env bash
# What the store costs a load test: runs `arbor loadtest` with and without the
# store, alternating, N times each, and prints the median wall times and their
# ratio. Usage: benches/store_cost.sh [N] [loadtest args...]
# (default: 9 rounds of --fanout 10 --depth 4).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-9}
shift || true
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--fanout 10 --depth 4)
cargo build --release --quiet
bin=target/release/arbor
wall() { "$bin" loadtest "${args[@]}" "$@" 2>/dev/null | awk '/wall time/ {print $3}'; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
off=(); on=()
for _ in $(seq "$n"); do
  off+=("$(wall --no-store)")
  on+=("$(wall)")
done
m_off=$(printf '%s\n' "${off[@]}" | median)
m_on=$(printf '%s\n' "${on[@]}" | median)
echo "loadtest ${args[*]}, $n rounds each, alternating"
echo "  --no-store: median ${m_off} s  (${off[*]})"
echo "  store:      median ${m_on} s  (${on[*]})"
awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "  ratio (store / no store): %.2fx\n", a / b}'

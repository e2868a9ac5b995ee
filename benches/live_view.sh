#!/usr/bin/env bash
# What the live tree view costs (issue 38): the CPU (user + system) of
# `arbor run` on a terminal drawing the view, against the same run with
# `--plain` (the line log), on a 1,011-agent tree of the simulated model
# (shape 10, 10, 9; 40 ms median latency). Whole processes, in rounds that
# alternate the two (A then B, then B then A, ...), each under a
# pseudo-terminal (util-linux's `script`), the screen thrown away. A run
# takes ~0.1 s of CPU and GNU time counts in 10 ms: the figure is the
# total over all rounds, (sum view - sum plain) / sum plain, with the
# per-round median beside it.
#
# Usage: benches/live_view.sh [--rounds N] [--arbor BIN]
#   (needs util-linux's script and GNU time; Debian: apt-get install time)
set -euo pipefail
rounds=7
arbor=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --arbor) arbor="$2"; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
here="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z "$arbor" ]]; then
    cargo build --release --bin arbor --manifest-path "$here/Cargo.toml" >&2
    arbor="$here/target/release/arbor"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/config.toml" <<'TOML'
[limits]
max_agents = 2000
max_live_agents = 64
max_steps = 100000
max_depth = 3

[models.sim]
provider = "simulated"
shape = [10, 10, 9]
latency = "lognormal:40ms,0.5"
reply_tokens = 60

[agents.lead]
model = "sim"
spawnable_agents = ["worker"]

[agents.worker]
model = "sim"
spawnable_agents = ["worker"]
TOML
# One run under a terminal; prints its user + system CPU seconds.
cpu() {
    local flags="$1"
    script -qec "env TERM=xterm COLUMNS=120 LINES=40 /usr/bin/time -f 'CPU %U %S' -o $work/time $arbor run --no-store --config $work/config.toml --agent lead $flags go >/dev/null" /dev/null >/dev/null </dev/null
    awk '/^CPU/ {print $2 + $3}' "$work/time"
}
cpu "" >/dev/null; cpu --plain >/dev/null  # warm-up
ratios=()
sum_view=0
sum_plain=0
for ((i = 0; i < rounds; i++)); do
    if ((i % 2 == 0)); then view=$(cpu ""); plain=$(cpu --plain)
    else plain=$(cpu --plain); view=$(cpu ""); fi
    ratio=$(awk -v v="$view" -v p="$plain" 'BEGIN {printf "%.4f", (v - p) / p}')
    echo "round $i: view ${view}s plain ${plain}s extra ${ratio}" >&2
    ratios+=("$ratio")
    sum_view=$(awk -v a="$sum_view" -v b="$view" 'BEGIN {print a + b}')
    sum_plain=$(awk -v a="$sum_plain" -v b="$plain" 'BEGIN {print a + b}')
done
median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
awk -v v="$sum_view" -v p="$sum_plain" -v m="$median" -v n="$rounds" 'BEGIN {
    printf "live view CPU over --plain, %d rounds: total %.2fs vs %.2fs, %+.1f%% (per-round median %+.1f%%)\n", n, v, p, (v - p) / p * 100, m * 100 }'

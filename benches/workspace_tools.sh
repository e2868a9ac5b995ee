#!/usr/bin/env bash
# The workspace tools (issue 36) against ripgrep, fd and cat, measured from
# outside: whole processes, in rounds that alternate Arbor and the baseline
# (A then B, then B then A, ...), over a large tree of real sources (a copy
# of the cargo registry's sources). Every figure is a median over the rounds;
# a ratio is taken within one round, so a machine that changes speed between
# rounds moves both sides alike.
#
# Arbor's side is `arbor run --no-store --workspace TREE --agent X --json`
# on a scripted model (provider "scripted") whose first step calls one
# workspace tool and whose second ends the run: the process starts, loads
# the config, runs the tool and prints the root's final state with the
# tool's result as JSON. The same run calling `workspace/think` (which does
# nothing) is timed in every round too: the runtime's fixed cost (process
# start, config, one tree), shown apart, never subtracted from the ratios;
# the "net" column is (Arbor - think) / baseline.
#
#   grep -l    workspace/grep output_mode files_with_matches
#              vs rg -l --hidden -g '!.git' PATTERN
#   grep -n    workspace/grep output_mode content (line numbers)
#              vs rg -n --hidden -g '!.git' PATTERN
#   glob       workspace/glob **/*.rs (the result shows 100 paths and the total)
#              vs fdfind -g '*.rs' -t f -H -E .git (prints every path)
#   glob few   workspace/glob **/build.rs vs fdfind -g build.rs -t f -H -E .git
#   read       workspace/read of 1,000 files in one call vs cat of the same files
#
# Arbor's walker honours .gitignore files outside a git repository, fd 8 and
# rg only inside one: the copy gets an empty .git directory at its top, so
# all three skip the same files. Hidden files are searched by all three, .git
# by none. Before the rounds, each pair's outputs are compared (the file sets,
# the content lines as sets, the glob's total against fd's count, the files
# read against their bytes); a difference stops the script.
#
# Usage: benches/workspace_tools.sh [options]   (needs rg, fdfind or fd, python3)
#   --rounds N     rounds (default 7; at least 1)
#   --tree DIR     the sources to copy and search (default:
#                  $CARGO_HOME/registry/src, else ~/.cargo/registry/src)
#   --keep DIR     keep the copy, the config and the raw times (TSV) in DIR
#                  (a second run with the same DIR reuses the copy)
#   --only NAMES   comma-separated pairs to run: grep-l,grep-n,glob,glob-few,read
#   --arbor BIN    time this arbor binary instead of building target/release/arbor
#                  (to measure an older build against the same baselines)
#
# Debian: apt-get install ripgrep fd-find python3
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=7 tree="" keep="" only="grep-l,grep-n,glob,glob-few,read" bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    --tree) tree=${2:?--tree needs a directory}; shift ;;
    --keep) keep=${2:?--keep needs a directory}; shift ;;
    --only) only=${2:?--only needs names}; shift ;;
    --arbor) bin=${2:?--arbor needs a binary}; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "workspace_tools.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$rounds" in
  ''|*[!0-9]*) echo "workspace_tools.sh: --rounds takes a whole number" >&2; exit 2 ;;
esac
[ "$rounds" -ge 1 ] || { echo "workspace_tools.sh: --rounds must be at least 1" >&2; exit 2; }

need() { command -v "$1" > /dev/null || { echo "workspace_tools.sh: needs $1 ($2)" >&2; exit 2; }; }
need rg "Debian: apt-get install ripgrep"
need python3 "Debian: apt-get install python3"
if command -v fdfind > /dev/null; then fd=fdfind
elif command -v fd > /dev/null; then fd=fd
else echo "workspace_tools.sh: needs fdfind or fd (Debian: apt-get install fd-find)" >&2; exit 2; fi

tree=${tree:-${CARGO_HOME:-$HOME/.cargo}/registry/src}
[ -d "$tree" ] || { echo "workspace_tools.sh: no sources at $tree (give --tree DIR)" >&2; exit 2; }

if [ -z "$bin" ]; then
  cargo build --release --quiet --bin arbor
  target=${CARGO_TARGET_DIR:-target}
  case "$target" in /*) ;; *) target=$(pwd)/$target ;; esac
  bin=$target/release/arbor
fi
[ -x "$bin" ] || { echo "workspace_tools.sh: $bin is not an executable" >&2; exit 2; }
case "$bin" in /*) ;; *) bin=$(pwd)/$bin ;; esac

work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
if [ ! -d "$work/tree/.git" ]; then
  echo "copying $tree to $work/tree" >&2
  rm -rf "$work/tree"
  cp -a "$tree" "$work/tree"
  mkdir "$work/tree/.git"
fi

python3 - "$bin" "$fd" "$work" "$rounds" "$only" <<'PY'
import json, os, statistics, subprocess, sys, time

arbor, fd, work, rounds, only = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(",")
tree = os.path.join(work, "tree")
cfg = os.path.join(work, "cfg")
os.makedirs(cfg, exist_ok=True)

GREP_L = r"fn main\("
GREP_N = r"fn new\(\) -> Self"
HIDDEN = ["--hidden", "-g", "!.git"]

# The 1,000 files to read: the first .rs files by path that a read shows
# whole and as they are (at most 2,000 lines, none longer than 2,000
# characters, UTF-8 without NUL or CR).
def readable(path):
    try:
        data = open(path, "rb").read()
    except OSError:
        return False
    if len(data) > 200_000 or b"\0" in data or b"\r" in data:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    lines = text.splitlines()
    return 0 < len(lines) <= 2000 and all(len(l) <= 2000 for l in lines) and text.endswith("\n")

rs = []
for d, dirs, files in os.walk(tree):
    dirs[:] = sorted(x for x in dirs if x != ".git")
    rs.extend(os.path.relpath(os.path.join(d, f), tree) for f in sorted(files) if f.endswith(".rs"))
to_read = [p for p in sorted(rs) if readable(os.path.join(tree, p))][:1000]
if len(to_read) < 1000:
    sys.exit(f"workspace_tools.sh: only {len(to_read)} readable .rs files under the tree")

calls = {
    "think": ("workspace__think", {"thought": "nothing to do"}),
    "grep-l": ("workspace__grep", {"pattern": GREP_L, "output_mode": "files_with_matches", "head_limit": 5000}),
    "grep-n": ("workspace__grep", {"pattern": GREP_N, "output_mode": "content", "head_limit": 5000}),
    "glob": ("workspace__glob", {"pattern": "**/*.rs"}),
    "glob-few": ("workspace__glob", {"pattern": "**/build.rs"}),
    "read": ("workspace__read", {"files": [{"path": p} for p in to_read]}),
}
config = ['[models.script]\nprovider = "scripted"\nfile = "script.json"\n']
script = {"replies": []}
for name, (tool, inp) in calls.items():
    agent = name.replace("-", "_")
    config.append(f'[agents.{agent}]\nmodel = "script"\ntools = ["workspace/*"]\n')
    script["replies"].append({"agent": agent, "steps": [
        {"toolCalls": [{"name": tool, "input": inp}]}, {"text": "done"}]})
open(os.path.join(cfg, "config.toml"), "w").write("\n".join(config))
json.dump(script, open(os.path.join(cfg, "script.json"), "w"))

def arbor_cmd(name):
    return [arbor, "run", "--config", os.path.join(cfg, "config.toml"), "--no-store",
            "--workspace", tree, "--agent", name.replace("-", "_"), "--json", "--quiet", "go"]

baseline = {
    "grep-l": ["rg", "-l", *HIDDEN, GREP_L],
    "grep-n": ["rg", "-n", *HIDDEN, GREP_N],
    "glob": [fd, "-g", "*.rs", "-t", "f", "-H", "-E", ".git"],
    "glob-few": [fd, "-g", "build.rs", "-t", "f", "-H", "-E", ".git"],
    "read": ["cat", "--", *to_read],
}
pairs = [p for p in ["grep-l", "grep-n", "glob", "glob-few", "read"] if p in only]

def run(cmd, out=subprocess.DEVNULL):
    with open(os.path.join(work, "err.tmp"), "w+b") as err:
        start = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=tree, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            sys.exit(f"workspace_tools.sh: {' '.join(cmd[:4])} ... failed: {err.read().decode(errors='replace')}")
    return wall, usage.ru_utime + usage.ru_stime

def captured(cmd):
    path = os.path.join(work, "out.tmp")
    with open(path, "wb") as f:
        run(cmd, f)
    return open(path, "rb").read()

def tool_result(name):
    state = json.loads(captured(arbor_cmd(name)))
    results = [m for m in state["messageHistory"] if m["role"] == "tool"]
    value = results[0]["content"][0]["value"]
    if isinstance(value, dict) and "errorMessage" in value:
        sys.exit(f"workspace_tools.sh: {name}: {value['errorMessage']}")
    return value

def differ(name, why):
    sys.exit(f"workspace_tools.sh: {name}: Arbor's output differs from the baseline's: {why}")

# The outputs, compared once (and warming the page cache).
notes = {}
for name in pairs:
    got = tool_result(name)
    want = captured(baseline[name])
    if name == "grep-l":
        mine, theirs = set(got["lines"]), set(want.decode().splitlines())
        if got["cut"] or mine != theirs:
            differ(name, f"{len(mine)} files vs {len(theirs)}, cut {got['cut']}")
        notes[name] = f"{len(mine)} files; Arbor lists them newest first, rg as found"
    elif name == "grep-n":
        mine = got["lines"]
        theirs = [l.rstrip("\r") for l in want.decode(errors="replace").splitlines()]
        if got["cut"] or sorted(mine) != sorted(theirs):
            differ(name, f"{len(mine)} lines vs {len(theirs)}, cut {got['cut']}")
        notes[name] = f"{len(mine)} lines, {sum(len(l) + 1 for l in mine)} bytes; Arbor's by path, rg's as found"
    elif name in ("glob", "glob-few"):
        theirs = set(want.decode().splitlines())
        if got["total"] != len(theirs) or not set(got["files"]) <= theirs:
            differ(name, f"{got['total']} files vs {len(theirs)}")
        if name == "glob-few" and set(got["files"]) != theirs:
            differ(name, "not the same files")
        shown = "all shown" if len(got["files"]) == got["total"] else f"Arbor shows {len(got['files'])} (its cap) and the total, fd prints all"
        notes[name] = f"{got['total']} files ({shown})"
    elif name == "read":
        if len(got) != len(to_read):
            differ(name, f"{len(got)} results for {len(to_read)} files")
        total = 0
        for r, p in zip(got, to_read):
            text = "".join(l.split("\t", 1)[1] + "\n" for l in r["content"].splitlines())
            data = open(os.path.join(tree, p), encoding="utf-8").read()
            if r.get("path") != p or text != data:
                differ(name, f"{p} read otherwise than cat shows it")
            total += len(data.encode())
        notes[name] = f"{len(to_read)} files, {total} bytes"

times = {}  # (pair, side) -> [(wall, cpu)]
tsv = open(os.path.join(work, "runs.tsv"), "w")
tsv.write("round\tpair\tside\twall_s\tcpu_s\n")
for r in range(rounds):
    steps = [("think", "arbor")]
    for name in pairs:
        order = [(name, "arbor"), (name, "base")]
        steps += order if r % 2 == 0 else order[::-1]
    for name, side in steps:
        wall, cpu = run(arbor_cmd(name) if side == "arbor" else baseline[name])
        times.setdefault((name, side), []).append((wall, cpu))
        tsv.write(f"{r + 1}\t{name}\t{side}\t{wall:.6f}\t{cpu:.6f}\n")
    tsv.flush()

def med(xs):
    return statistics.median(xs)

think = times[("think", "arbor")]
print(f"tree: {tree} ({sum(len(f) for _, _, f in os.walk(tree))} files); {rounds} rounds")
print(f"fixed cost (workspace/think): {med([w for w, _ in think]) * 1000:.1f} ms wall, {med([c for _, c in think]) * 1000:.1f} ms CPU")
print("| pair | Arbor wall ms | baseline wall ms | ratio (range) | net of think | Arbor CPU ms | baseline CPU ms | CPU ratio | output |")
print("|---|---|---|---|---|---|---|---|---|")
for name in pairs:
    a, b = times[(name, "arbor")], times[(name, "base")]
    ratios = [x[0] / y[0] for x, y in zip(a, b)]
    net = [(x[0] - t[0]) / y[0] for x, y, t in zip(a, b, think)]
    cpu = [x[1] / y[1] for x, y in zip(a, b) if y[1] > 0] or [float("nan")]
    print(f"| {name} | {med([x[0] for x in a]) * 1000:.1f} | {med([y[0] for y in b]) * 1000:.1f} "
          f"| {med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {med(net):.2f}x "
          f"| {med([x[1] for x in a]) * 1000:.1f} | {med([y[1] for y in b]) * 1000:.1f} "
          f"| {med(cpu):.2f}x | {notes[name]} |")
PY

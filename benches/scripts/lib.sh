# Sourced by the benchmark scripts (`. benches/scripts/lib.sh NAME` from the repository root, or `. "$here/lib.sh" NAME`; NAME for messages):
# a temporary directory `$tmp`, the processes a script starts (append their pids to
# `pids`; killed and reaped at exit, `$tmp` removed), and the helpers below.
script_name=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$script_name.XXXXXX")
pids=()
cleanup() {
  # Only what the script started, by pid.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# need BIN...: exits 2 naming the first that is not an executable.
need() {
  local b
  for b; do
    [ -x "$b" ] || { echo "$script_name: missing $b (see the top of this script)" >&2; exit 2; }
  done
}

# listening FILE KIND: waits (5 s) for a `listening KIND ADDR` line in FILE, prints ADDR;
# exits 2 with FILE's content when none comes.
listening() {
  local a
  for _ in $(seq 100); do
    a=$(awk -v k="$2" '$1 == "listening" && $2 == k { print $3; exit }' "$1" 2>/dev/null)
    [ -n "$a" ] && { echo "$a"; return; }
    sleep 0.05
  done
  echo "$script_name: no 'listening $2' line in $1:" >&2
  cat "$1" >&2
  exit 2
}

# ticks PID: its CPU time so far (utime + stime), in clock ticks (`getconf CLK_TCK`).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

#!/usr/bin/env bash
# CI's fuzz step (called at the end of .ci/run): builds the fuzz targets and runs each
# for FUZZ_SECONDS (default 20) with AddressSanitizer, starting from the committed
# corpus. New inputs go to a temporary directory, so the clone's corpus is left as it
# was; a crash fails the step and leaves its input in fuzz/artifacts/<target>/.
# Installs cargo-fuzz if it is missing.
set -euo pipefail
cd "$(dirname "$0")"
secs=${FUZZ_SECONDS:-20}

if cargo +nightly --version >/dev/null 2>&1; then
  toolchain=(+nightly)
else
  # A machine with only the stable toolchain: rustc accepts the unstable flags
  # cargo-fuzz passes (-Zsanitizer, sancov) when bootstrapping is allowed.
  echo "no nightly toolchain: building the fuzz targets with stable and RUSTC_BOOTSTRAP=1"
  export RUSTC_BOOTSTRAP=1
  toolchain=()
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cargo "${toolchain[@]}" fuzz build
for t in $(cargo "${toolchain[@]}" fuzz list); do
  dict=jsonrpc.dict
  [ "$t" = http ] && dict=http.dict
  [ "$t" = client ] && dict=client.dict
  mkdir -p "$tmp/$t"
  echo "== fuzz $t for ${secs}s"
  if ! cargo "${toolchain[@]}" fuzz run "$t" "$tmp/$t" "corpus/$t" -- \
    -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -dict="$dict" >"$tmp/$t.log" 2>&1; then
    tail -80 "$tmp/$t.log"
    echo "fuzz target $t failed; the input is in fuzz/artifacts/$t/ (docs/FUZZING.md: reproducing)"
    exit 1
  fi
  grep -E '^#[0-9]+.*DONE' "$tmp/$t.log" | tail -1
done

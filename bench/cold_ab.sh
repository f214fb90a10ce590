#!/bin/bash
# Cold A/B rounds of mount variants against `pread` of the pack, for cuts to the cold path
# (docs/DESIGN.md, "A cold shuffled epoch without an order"). Each round: drop_caches, 300 MB of
# the pack by dd with O_DIRECT (the disk's mood), a cold `pread` pass of the pack, then each
# variant cold in turn (drop_caches and `loosefs drop-cache` before each). Needs root and
# `cargo build --release --features bench`.
#
#   bench/cold_ab.sh ROUNDS THREADS ORDER DATA PACK "ARGS_A" "ARGS_B" ...
#
# ARGS are `loosefs mount` options; `BIN=/path/loosefs ARGS` mounts with another build.
set -eu
R=$1; T=$2; O=$3; DATA=$4; PACK=$5; shift 5
B=$(cd "$(dirname "$0")/.." && pwd)/target/release
WORK=$(mktemp -d)
files_per_s() { python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read().splitlines()[-1])["files_per_s"]))'; }
n=0
for a in "$@"; do
  bin=$B/loosefs
  case "$a" in BIN=*) bin=${a%% *}; bin=${bin#BIN=}; a=${a#"BIN=$bin"}; a=${a# } ;; esac
  mkdir -p "$WORK/m$n"
  # shellcheck disable=SC2086 # ARGS are words
  "$bin" mount "$PACK" "$WORK/m$n" $a >/dev/null
  n=$((n + 1))
done
cleanup() { for k in $(seq 0 $((n - 1))); do "$B/loosefs" umount "$WORK/m$k" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; for k in $(seq 0 $((n - 1))); do "$B/loosefs" drop-cache "$WORK/m$k" >/dev/null; done; }
for r in $(seq "$R"); do
  cold
  t0=$(date +%s%N); dd if="$PACK" of=/dev/null bs=1M count=300 iflag=direct 2>/dev/null; t1=$(date +%s%N)
  line="round $r: dd $((300 * 1000000000 / (t1 - t0))) MB/s, pread $("$B/loosefs-reader" --root "$DATA" --pack "$PACK" --threads "$T" --order "$O" --seed "$r" | files_per_s)"
  for k in $(seq 0 $((n - 1))); do
    cold
    line="$line | $k: $("$B/loosefs-reader" --root "$WORK/m$k" --threads "$T" --order "$O" --seed "$r" | files_per_s)"
  done
  echo "$line files/s"
done

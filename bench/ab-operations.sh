#!/usr/bin/env bash
# A/B: metrics+tracing off vs on, durable (sync_all, the default) unique-key enqueues at 32
# connections, alternating off/on for ROUNDS rounds (default 5), each a fresh server on a fresh
# data directory. Prints each round's rates and the median of the on/off ratios. Build first:
#   cargo build --release --bin sepp -p sepp-server && cargo build --release -p sepp-bench
# "on": [metrics] enabled (not scraped during the run) and [tracing] with sample_ratio
# $SAMPLE_RATIO (default 1.0) and
# an OTLP endpoint where nothing listens: every span is made and batched, the export fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp-bench
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  declare -A rate=()
  for v in off on; do
    d=$(mktemp -d "${TMPDIR:-/tmp}/sepp-ab-XXXX")
    {
      echo "[server]"; echo "db_path = \"$d/data\""; echo 'listen_addr = "127.0.0.1:0"'
      if [ "$v" = on ]; then
        echo "[metrics]"; echo "enabled = true"; echo 'listen_addr = "127.0.0.1:0"'
        echo "[tracing]"; echo 'otlp_endpoint = "http://127.0.0.1:4399"'; echo "sample_ratio = ${SAMPLE_RATIO:-1.0}"
      fi
    } > "$d/sepp.toml"
    coproc SRV { SEPP_LOG=error exec "$BIN" --config "$d/sepp.toml" 2>"$d/server.log"; }
    read -r line <&"${SRV[0]}"
    addr=${line#sepp listening on }
    "$BENCH" --target "$addr" --workloads unique --connections 32 --duration "$DURATION" \
      --warmup 1 --results-dir "$d" >"$d/bench.out" 2>&1
    rate[$v]=$(python3 -c 'import json,sys,glob; r=json.load(open(sorted(glob.glob(sys.argv[1]+"/*.json"))[-1])); print(r["runs"][0]["points"][0]["jobs_per_s"])' "$d")
    kill -TERM "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true
    rm -rf "$d"
  done
  ratio=$(python3 -c "print(f'{${rate[on]}/${rate[off]}:.3f}')")
  ratios+=("$ratio")
  printf 'round %d: off %.0f jobs/s, on %.0f jobs/s, on/off %s\n' "$r" "${rate[off]}" "${rate[on]}" "$ratio"
  unset rate
done
python3 -c 'import statistics,sys; print(f"median on/off over {len(sys.argv)-1} rounds: {statistics.median(map(float, sys.argv[1:])):.3f} (target >= 0.95)")' "${ratios[@]}"

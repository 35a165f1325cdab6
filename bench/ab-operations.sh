#!/usr/bin/env bash
# A/B: metrics+tracing off vs on, durable (sync_all) unique-key enqueues at 32 connections,
# alternating off/on for ROUNDS rounds (default 5). Build first:
#   cargo build --release --bin sepp -p sepp-server && cargo build --release -p sepp-bench
# "on": [metrics] enabled (not scraped during the run) and [tracing] with sample_ratio 1.0 and
# an OTLP endpoint where nothing listens: every span is made and batched, the export fails.
# NOT RUN YET: the rate line is grepped from sepp-bench output; check its format first.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp-bench
ROUNDS=${ROUNDS:-5}
for r in $(seq 1 $ROUNDS); do
  for v in off on; do
    d=$(mktemp -d ${TMPDIR:-/tmp}/sepp-ab-XXXX)
    {
      echo "[server]"; echo "db_path = \"$d/data\""; echo 'listen_addr = "127.0.0.1:0"'
      if [ $v = on ]; then
        echo "[metrics]"; echo "enabled = true"; echo 'listen_addr = "127.0.0.1:0"'
        echo "[tracing]"; echo 'otlp_endpoint = "http://127.0.0.1:4399"'; echo "sample_ratio = 1.0"
      fi
    } > $d/sepp.toml
    coproc SRV { SEPP_LOG=error exec $BIN --config $d/sepp.toml 2>$d/server.log; }
    read -r line <&${SRV[0]}
    addr=${line#sepp listening on }
    out=$($BENCH --target $addr --workloads unique --connections 32 --duration 5 --warmup 1 2>&1)
    rate=$(echo "$out" | grep -iE "unique" | grep -oE "[0-9][0-9,]*(\.[0-9]+)? jobs/s" | head -1)
    echo "round $r $v $rate"
    echo "$out" > $d/bench.out
    kill -TERM $SRV_PID; wait $SRV_PID 2>/dev/null
  done
done

#!/usr/bin/env bash
# The CPU cost of metrics and tracing per RPC, in instructions. The server runs under
# `valgrind --tool=callgrind` (which counts instructions executed: the same count for the same
# work, whatever else the machine is doing), once with metrics and tracing off and once on,
# each serving durable unique-key enqueues from sepp-bench. For each it prints the
# instructions per RPC spent on the request path: the inclusive count of the outermost gRPC
# service (the metrics timing layer when metrics are on, else the QueueService router), which
# holds conversion, validation, the span, the metrics and the queue's work up to the group
# commit, divided by the RPCs served. The whole process's count is not used: an idle server's
# background threads spin for a very variable number of instructions under callgrind, which
# serialises threads.
#   cargo build --release --bin sepp -p sepp-server && cargo build --release -p sepp-bench
#   bench/cost-instructions.sh
# WORKLOAD (default unique) is a sepp-bench workload: unique, batch100 or batch1000 (one
# EnqueueBatch call of 100 or 1,000 fresh keyed jobs; batch1000 sets limits.max_enqueue_batch =
# 1000). It also prints the instructions per job,
# and the flusher's (the group commit thread: fjall batch, journal write, fsync call) per job,
# which runs off the request path but is the server's CPU too.
# Env: SAMPLE_RATIO (tracing.sample_ratio when on, default 0.01), CONNS (8), DURATION (15 s),
# SEPP_BENCH_BIN (the server binary), ONLY=metrics or ONLY=tracing (turn on only that one),
# KEEP (a path prefix: keeps each variant's callgrind output as KEEP.off / KEEP.on for
# callgrind_annotate), LOG (the server's SEPP_LOG, default error: no log layer work; `info`, the server's default
# level, adds the log layer's work on each RPC's span), VARIANTS (default "off on").
# "On" is the configuration of bench/ab-operations.sh: [metrics] enabled (not scraped) and
# [tracing] exporting to an OTLP endpoint where nothing listens.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=${SEPP_BENCH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp}
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp-bench
CONNS=${CONNS:-8}
DURATION=${DURATION:-15}
command -v callgrind_annotate >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

WORKLOAD=${WORKLOAD:-unique}

# run VARIANT: prints "<request-path instructions> <rpcs> <jobs> <flusher instructions>"
run() {
  local v=$1 d line addr rpcs jobs ir
  d=$(mktemp -d "${TMPDIR:-/tmp}/sepp-cost-XXXX")
  {
    echo "[server]"; echo "db_path = \"$d/data\""; echo 'listen_addr = "127.0.0.1:0"'
    # The default max_enqueue_batch is 256.
    if [ "$WORKLOAD" = batch1000 ]; then echo "[limits]"; echo "max_enqueue_batch = 1000"; fi
    if [ "$v" = on ] && [ "${ONLY:-}" != tracing ]; then
      echo "[metrics]"; echo "enabled = true"; echo 'listen_addr = "127.0.0.1:0"'
    fi
    if [ "$v" = on ] && [ "${ONLY:-}" != metrics ]; then
      echo "[tracing]"; echo 'otlp_endpoint = "http://127.0.0.1:4399"'; echo "sample_ratio = ${SAMPLE_RATIO:-0.01}"
    fi
  } > "$d/sepp.toml"
  coproc SRV { SEPP_LOG=${LOG:-error} exec valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" \
    "$BIN" --config "$d/sepp.toml" 2>"$d/server.log"; }
  read -r line <&"${SRV[0]}"
  addr=${line#sepp listening on }
  # No warm-up: every RPC the server served is counted.
  "$BENCH" --target "$addr" --workloads "$WORKLOAD" --connections "$CONNS" --duration "$DURATION" \
    --warmup 0 --results-dir "$d" >"$d/bench.out" 2>&1
  read -r rpcs jobs < <(python3 -c 'import json,sys,glob; r=json.load(open(sorted(glob.glob(sys.argv[1]+"/*.json"))[-1])); p=r["runs"][0]["points"][0]; print(p["rpcs"], p["jobs"])' "$d")
  kill -TERM "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true
  ir=$(callgrind_annotate --inclusive=yes --threshold=100 "$d/cg.out" 2>/dev/null | python3 -c '
import re, sys
timed = router = None
flusher = 0
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) ", line)
    if not m:
        continue
    n = int(m.group(1).replace(",", ""))
    if "api::timed::Timed<S> as tower_service::Service" in line and "::call::{{closure}}" in line:
        timed = max(timed or 0, n)
    elif "queue_service_server::QueueServiceServer<T> as tower_service::Service" in line and line.rstrip().endswith("]") and "::call::{{closure}} [" in line:
        router = max(router or 0, n)
    elif "group_commit::GroupCommit::run_flusher" in line and line.rstrip().endswith("]"):
        flusher = max(flusher, n)
print(timed if timed is not None else router, flusher)')
  if [ -n "${KEEP:-}" ]; then cp "$d/cg.out" "$KEEP.$v"; fi
  rm -rf "$d"
  echo "$ir $rpcs $jobs"
}

declare -A per=()
for v in ${VARIANTS:-off on}; do
  read -r ir flusher rpcs jobs < <(run "$v")
  per[$v]=$(python3 -c "print($ir/$rpcs)")
  printf '%s: %s, %d RPCs, %.0f instructions per RPC on the request path\n' "$v" "$WORKLOAD" "$rpcs" "${per[$v]}"
  if [ "$jobs" != "$rpcs" ]; then
    python3 -c "print(f'$v: {$jobs} jobs, {$ir/$jobs:.0f} instructions per job on the request path, {$flusher/$jobs:.0f} in the flusher, {($ir+$flusher)/$jobs:.0f} together')"
  fi
done
[ -n "${per[on]:-}" ] && [ -n "${per[off]:-}" ] || exit 0
python3 -c "print(f'on/off: {${per[on]}/${per[off]}:.3f} (sample_ratio ${SAMPLE_RATIO:-0.01}{\", only \" + \"${ONLY:-}\" if \"${ONLY:-}\" else \"\"})')"

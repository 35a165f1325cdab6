#!/usr/bin/env bash
# A/B of two server builds, side by side in one sitting: for each workload, each build serves
# it on a fresh server and data directory, the order alternating per round (AB, BA, ...).
# Reports, per point, jobs/s and p99 (from sepp-bench), and the server's CPU per job, whole
# process and fjall's worker threads alone, read from /proc per thread over the measured
# window, the data directory's size (MiB, `du`) after the point, the server stopped, and the
# bytes the server wrote to storage per job over the window (`write_bytes` of /proc/PID/io:
# the journal, flushes and compactions); then,
# per workload, the medians and the median (min-max) of the per-round ratios B/A.
#   bench/ab-builds.sh OLD_BIN NEW_BIN            (absolute or relative paths to `sepp` binaries)
# Env: ROUNDS (5), DURATION (10 s per point, after an unmeasured 1 s run), CONNS (32),
# WORKLOADS ("batch100 batch1000 unique"; any sepp-bench workload), BENCH_ARGS (more
# sepp-bench arguments, e.g. "--payload-random"). Every server gets
# limits.max_enqueue_batch = 1000 so that batch1000 runs.
# Build sepp-bench first: cargo build --release -p sepp-bench
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/sepp-bench
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
WORKLOADS=${WORKLOADS:-batch100 batch1000 unique}
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
OUT=$(mktemp "${TMPDIR:-/tmp}/sepp-ab-builds-XXXX.txt")

# CPU ticks of every thread of process $1: "tid name ticks", sorted by tid.
threads() {
  for t in /proc/"$1"/task/*; do
    echo "${t##*/} $(tr ' ' _ <"$t/comm" 2>/dev/null) $(awk '{print $14+$15}' "$t/stat" 2>/dev/null)"
  done 2>/dev/null | awk 'NF==3' | sort
}

# point BIN WORKLOAD: prints "jobs/s p99_ms server_us_per_job fjall_us_per_job disk_mib"
point() {
  local bin=$1 w=$2 d line addr out rate p99 tick disk
  d=$(mktemp -d "${TMPDIR:-/tmp}/sepp-ab-builds-XXXX")
  printf '[server]\ndb_path = "%s/data"\nlisten_addr = "127.0.0.1:0"\n[limits]\nmax_enqueue_batch = 1000\n' \
    "$d" >"$d/sepp.toml"
  coproc SRV { SEPP_LOG=error exec "$bin" --config "$d/sepp.toml" 2>"$d/server.log"; }
  read -r line <&"${SRV[0]}"
  addr=${line#sepp listening on }
  "$BENCH" --target "$addr" --workloads "$w" --connections "$CONNS" --duration 1 --warmup 0 \
    --no-json "${EXTRA[@]}" >/dev/null 2>&1
  threads "$SRV_PID" >"$d/before"
  wb0=$(awk '/^write_bytes/ {print $2}' /proc/"$SRV_PID"/io)
  out=$("$BENCH" --target "$addr" --workloads "$w" --connections "$CONNS" --duration "$DURATION" \
    --warmup 0 --no-json "${EXTRA[@]}" 2>&1 | grep '^external  ')
  threads "$SRV_PID" >"$d/after"
  wb1=$(awk '/^write_bytes/ {print $2}' /proc/"$SRV_PID"/io)
  kill -TERM "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true
  disk=$(du -sm "$d/data" 2>/dev/null | cut -f1)
  disk=${disk:-nan}
  rate=$(awk '{gsub(",", "", $4); print $4}' <<<"$out")
  p99=$(awk '{print $9}' <<<"$out")
  tick=$(getconf CLK_TCK)
  join "$d/before" "$d/after" | awk -v r="$rate" -v D="$DURATION" -v p="$p99" -v hz="$tick" -v dk="$disk" \
    -v wb="$((wb1 - wb0))" \
    '$2 == $4 { dt = $5 - $3; all += dt; if ($2 ~ /fjall/) fj += dt }
     END { n = r * D; printf "%s %s %.2f %.2f %s %.0f\n", r, p, all * 1e6 / hz / n, fj * 1e6 / hz / n, dk, wb / n }'
  rm -rf "$d"
}

for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for w in $WORKLOADS; do
    for v in $order; do
      if [ "$v" = A ]; then bin=$A; else bin=$B; fi
      echo "$w $v $r $(point "$bin" "$w")" | tee -a "$OUT"
    done
  done
done

echo "A = $A"
echo "B = $B"
python3 - "$OUT" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    w, v, r, *x = line.split()
    d[(w, r)][v] = [float(f) for f in x]
for w in dict.fromkeys(k[0] for k in d):
    rounds = [p for (ww, _), p in d.items() if ww == w and len(p) == 2]
    def med(i, v):
        return statistics.median(p[v][i] for p in rounds)
    def ratio(i):
        q = [p["B"][i] / p["A"][i] for p in rounds if p["A"][i]]
        return f"{statistics.median(q):.2f} ({min(q):.2f}-{max(q):.2f})" if q else "-"
    print(f"{w}, {len(rounds)} rounds, A -> B, medians; B/A per round: median (min-max)")
    names = ["jobs/s", "p99 ms", "server CPU us/job", "fjall threads us/job", "disk MiB",
             "bytes written/job"][:len(rounds[0]["A"])]
    for i, name in enumerate(names):
        print(f"  {name:22} {med(i, 'A'):>10.2f} -> {med(i, 'B'):>10.2f}   {ratio(i)}")
EOF
echo "raw points: $OUT"

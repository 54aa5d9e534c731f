#!/bin/bash
# One sitting: DP on one host and on two "hosts" (two launchers on 127.0.0.1), then
# conform and bench unsharded and as shards 1/2 and 2/2, merged, compared and gated.
# Usage (from the checkout): bash reports/sharding-cpu-2026-12-07/measure.sh OUT_DIR
set -u
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
H=".venv/bin/python -m harness"
t() { local name=$1; shift; local s=$(date +%s.%N); "$@" > "$OUT/$name.log" 2>&1; local rc=$?; local e=$(date +%s.%N); printf '%s rc=%s %.1f s\n' "$name" "$rc" "$(echo "$e - $s" | bc)" | tee -a "$OUT/times.txt"; }
lscpu | grep -E "Model name|^CPU\(s\)" > "$OUT/cpu.txt"
DIST="dist --dp-size 4 --backend sdpa --steps 8"
t dist-one-host $H $DIST --json "$OUT/dist-one-host.json"
PORT=$((20000 + RANDOM % 20000))
s=$(date +%s.%N)
$H $DIST --nnodes 2 --node-rank 1 --master 127.0.0.1:$PORT --json "$OUT/dist-node1.json" > "$OUT/dist-node1.log" 2>&1 &
$H $DIST --nnodes 2 --node-rank 0 --master 127.0.0.1:$PORT --json "$OUT/dist-node0.json" > "$OUT/dist-node0.log" 2>&1; rc0=$?
wait $!; rc1=$?
printf 'dist-two-hosts rc=%s,%s %.1f s\n' "$rc0" "$rc1" "$(echo "$(date +%s.%N) - $s" | bc)" | tee -a "$OUT/times.txt"
C="conform --backend sdpa --backend reference --workers 1"
t conform-whole $H $C --junitxml "$OUT/conform-whole.xml"
t conform-shard-1 $H $C --shard 1/2 --junitxml "$OUT/conform-1.xml"
t conform-shard-2 $H $C --shard 2/2 --junitxml "$OUT/conform-2.xml"
t conform-merge $H merge --out "$OUT/conform-merged.xml" "$OUT/conform-1.xml" "$OUT/conform-2.xml"
B="bench --backend sdpa --backend compiled --workload decode-sweep --workload prefill-sweep --no-progress"
t bench-whole $H $B --out "$OUT/bench-whole.json"
t bench-shard-1 $H $B --shard 1/2 --out "$OUT/bench-1.json"
t bench-shard-2 $H $B --shard 2/2 --out "$OUT/bench-2.json"
t bench-merge $H merge --out "$OUT/bench-merged.json" "$OUT/bench-1.json" "$OUT/bench-2.json"
BASE=reports/baselines/cpu-amd-epyc-2cpu/baseline.json
t gate-whole $H gate --baseline $BASE "$OUT/bench-whole.json"
t gate-merged $H gate --baseline $BASE "$OUT/bench-merged.json"
echo done >> "$OUT/times.txt"

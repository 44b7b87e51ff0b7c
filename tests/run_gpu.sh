#!/usr/bin/env bash
# Build on a GPU machine and run the GPU tests, compute-sanitizer on a subset,
# and the benchmark against PyTorch. Logs go to $OUT (or ./gpu-logs).
# Lua: FLASHGEN_LUA_DIR may name a folder with include/ and lib/liblua5.4.a.
set -u
out=${OUT:-gpu-logs}
mkdir -p "$out"
step=${1:-all}
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release ${FLASHGEN_LUA_DIR:+-DFLASHGEN_LUA_DIR=$FLASHGEN_LUA_DIR} \
  > "$out/build.log" 2>&1 && cmake --build build-gpu -j16 >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
export FLASHGEN_CACHE_DIR=$PWD/build-gpu/cache
if [ "$step" = all ] || [ "$step" = test ]; then
  (cd build-gpu && ctest -L gpu --output-on-failure 2>&1 | tee "$out/ctest-gpu.log" | tail -60)
  compute-sanitizer --tool memcheck build-gpu/tests/gpu_forward --quick > "$out/sanitizer.log" 2>&1
  echo "compute-sanitizer: $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log") $(grep -E 'passed,' "$out/sanitizer.log")"
  compute-sanitizer --tool memcheck build-gpu/tests/gpu_backward --quick > "$out/sanitizer-backward.log" 2>&1
  echo "compute-sanitizer backward: $(grep -E 'ERROR SUMMARY' "$out/sanitizer-backward.log") $(grep -E 'passed,' "$out/sanitizer-backward.log")"
  compute-sanitizer --tool memcheck build-gpu/tests/gpu_varlen --quick > "$out/sanitizer-varlen.log" 2>&1
  echo "compute-sanitizer varlen: $(grep -E 'ERROR SUMMARY' "$out/sanitizer-varlen.log") $(grep -E 'passed,' "$out/sanitizer-varlen.log")"
  compute-sanitizer --tool synccheck build-gpu/tests/gpu_varlen --quick > "$out/synccheck-varlen.log" 2>&1
  echo "compute-sanitizer synccheck varlen: $(grep -E 'ERROR SUMMARY' "$out/synccheck-varlen.log") $(grep -E 'passed,' "$out/synccheck-varlen.log")"
  compute-sanitizer --tool memcheck build-gpu/tests/gpu_decode --quick > "$out/sanitizer-decode.log" 2>&1
  echo "compute-sanitizer decode: $(grep -E 'ERROR SUMMARY' "$out/sanitizer-decode.log") $(grep -E 'passed,' "$out/sanitizer-decode.log")"
fi
if [ "$step" = all ] || [ "$step" = bench ]; then
  build-gpu/flashgen demo 2>&1 | tee "$out/demo.log"
  build-gpu/flashgen bench --csv ${BENCH_ARGS:-} > "$out/bench.csv" 2> "$out/bench.err"; cat "$out/bench.err"
  grep -v '^flashgen,' "$out/bench.csv"
  PYTHONUNBUFFERED=1 python3 bench/sdpa.py "$out/bench.csv" 2>&1 | tee "$out/bench.txt"
fi

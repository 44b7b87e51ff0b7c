export FLASHGEN_LUA_DIR=$PWD/.lua OUT=${OUT:-/tmp/out}
cmake -S . -B bg -DCMAKE_BUILD_TYPE=Release -DFLASHGEN_LUA_DIR=$FLASHGEN_LUA_DIR > $OUT/build.log 2>&1 && cmake --build bg -j16 --target flashgen_cli >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
F=bg/flashgen
c() { echo "== $*"; timeout 120 $F check "$@" 2>&1 | tail -3; }
c -d 64 --batch 2 --heads 8 --seqlen 1000
c -d 128 --dtype bf16 --mask causal --seqlen-q 1000 --seqlen-k 1300
c -d 128 --dtype bf16 --mask causal --seqlen-q 700 --seqlen-k 300
c -d 128 --mask causal --align top-left --seqlen-q 700 --seqlen-k 300
c -d 33 --mask window --window 50,7 --seqlen 555
c -d 256 --dtype bf16 --dropout --dropout-p 0.1 --seqlen 300
c -d 72 --sparsity butterfly --mask causal --sparse-block 128x128 --seqlen 1100
c -d 128 --dtype bf16 --sparsity layout --sparse-block 128x128 --seqlen 1000
c -d 96 --heads 8 --kv-heads 2 --layout bhsd --seqlen-q 17 --seqlen-k 4097
c -d 8 --seqlen 1
echo "== sanitizer"; compute-sanitizer --tool memcheck $F check -d 128 --dtype bf16 --mask causal --dropout --dropout-p 0.2 --seqlen-q 300 --seqlen-k 257 --batch 1 --heads 2 2>&1 | tail -4
$F bench --quick --csv > $OUT/bench.csv 2>&1; grep -v "^flashgen," $OUT/bench.csv | head
PYTHONUNBUFFERED=1 timeout 200 python3 bench/sdpa.py $OUT/bench.csv 2>&1 | tail -12

#!/bin/sh
# The command line as a new user meets it: exit status 2 for a wrong command
# line and 1 for a failure, one message prefix, options that do not apply
# refused, --opt=value, the valid values of a bad enumeration listed, flags
# named as typed, the options of packed sequences and of a KV cache and what
# they do not go with, the scores' variants (--softcap, --alibi, --sinks),
# check/bench/tune without a GPU, cache --dir (or FLASHGEN_CACHE_DIR) of a
# missing folder, cache --arch of no target, a bundle build that selects
# nothing or everything without --all, options given twice, values with
# white space, each command's defaults in its help, warnings for environment
# values that are not understood (and the families named as docs/command-line.md names
# them), source --all-targets, the plan that runs, and a compile from the
# cache labelled so; a value head dim of its own (--head-dim-v, and bundle
# build's --head-dims-v): plans, sources and compiles, and what is refused.
#
# usage: test_cli.sh PATH-TO-flashgen
set -u
cli=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fg_cli_test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
export FLASHGEN_CACHE_DIR="$tmp/cache"
unset FLASHGEN_CACHE FLASHGEN_TUNING FLASHGEN_BUNDLE_PATH FLASHGEN_COMPILE_LOG FLASHGEN_NVRTC FLASHGEN_PROGRESS
passed=0
failed=0
with="" # environment settings for the next run: "NAME=value ..."

fail() {
    failed=$((failed + 1))
    echo "FAIL: $1"
    sed 's/^/  | /' "$tmp/out" | head -20
}

# expect STATUS TEXT ARGS...: flashgen ARGS exits with STATUS, its output
# (stdout and stderr) holds TEXT ("" for anything), and when it fails its
# first message starts with "flashgen: ".
expect() {
    want=$1 text=$2
    shift 2
    env $with "$cli" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
    rc=$?
    cat "$tmp/stdout" "$tmp/stderr" >"$tmp/out"
    if [ "$rc" -ne "$want" ]; then
        fail "flashgen $*: exit status $rc, expected $want"
    elif [ -n "$text" ] && ! grep -qF -- "$text" "$tmp/out"; then
        fail "flashgen $*: no '$text' in the output"
    elif [ "$want" -ne 0 ] && ! head -n 1 "$tmp/stderr" | grep -q '^flashgen: '; then
        fail "flashgen $*: the message does not start with 'flashgen: '"
    else
        passed=$((passed + 1))
    fi
}

# lines TEXT N: the last run's output holds TEXT on exactly N lines.
lines() {
    n=$(grep -cF -- "$1" "$tmp/out")
    if [ "$n" -ne "$2" ]; then
        fail "'$1' on $n lines, expected $2"
    else
        passed=$((passed + 1))
    fi
}

# ---- exit status: 2 for the command line, 1 for failures ----
expect 2 "usage: flashgen" 
expect 2 "flashgen: unknown command 'bogus'" bogus
expect 2 "unknown option --foo for plan" plan --target h100 --foo
expect 2 "unexpected argument 'h100'" plan h100
expect 2 "flashgen: cache: name a subcommand" cache
expect 2 "flashgen: bundle: name a subcommand" bundle
expect 2 "--batch needs a value" check --batch
expect 2 "--dropout takes no value" plan --target h100 --dropout=1
expect 0 "--all-targets" source --help
# a valid command line that fails: bf16 on t4
expect 1 "flashgen: t4: --dtype bf16: bf16 needs sm_80" compile --target t4 --dtype bf16
lines "regs  spill" 0 # no table's header over an error alone

# ---- options that do not apply are refused ----
for command in plan source compile; do
    for option in "--seqlen 128" "--seqlen-q 64" "--seqlen-k 64" "--batch 2" "--heads 4" \
        "--kv-heads 2" "--layout bhsd" "--align top-left" "--window 8,8" "--dropout-p 0.1" \
        "--scale 0.5" "--seed 3" "--density 0.5" "--lengths 3" "--cache-len 3" "--new 1" \
        "--page-size 16" "--splits 2"; do
        expect 2 "$command does not take $option: problem options are launch arguments" \
            $command --target h100 $option
    done
done
expect 2 "--sparse-block 64x32 needs --sparsity layout or butterfly" plan --target h100 --sparse-block 64x32
expect 2 "--butterfly-factors 3 needs --sparsity butterfly" \
    plan --target h100 --sparsity layout --butterfly-factors 3
expect 2 "--mask window needs --window L,R" check --mask window
expect 2 "--window 4,4 needs --mask window" check --window 4,4
expect 2 "--align top-left aligns a causal or window mask" check --align top-left
expect 2 "--dropout-p 0.1 needs --dropout" check --dropout-p 0.1
expect 2 "--density 0.3 needs --sparsity layout" check --density 0.3
expect 2 "--deterministic picks the backward's schedule" check --deterministic
expect 2 "--kv-heads 3: --heads 8 is not a multiple of it" check --heads 8 --kv-heads 3
expect 2 "check does not take --target h100" check --target h100
expect 2 "bench does not take --mask causal" bench --mask causal
expect 2 "bench does not take --batch 4" bench --batch 4
expect 2 "it takes no --csv" bench --philox --csv
expect 2 "tune --standard tunes the benchmark's specs: it takes no -d 64" tune --standard -d 64
expect 2 "tune does not take --seqlen 512" tune --seqlen 512
expect 2 "--target h100 and --all-targets" plan --target h100 --all-targets

# ---- each command's help gives its own defaults: demo's problem is not check's ----
expect 0 "by default bf16, d=128, causal, batch 4, 16 heads, 2048" demo --help
for text in "--dtype fp16|bf16          (default bf16)" "1..256, 1..576 with --kv-cache latent (default 128)" \
    "--mask none|causal|window  (default causal)" "(default 4, 16, as many as --heads)" \
    "--seqlen-k N   (default 2048)"; do
    lines "$text" 1
done
expect 0 "--dtype fp16|bf16          (default fp16)" check --help
for text in "1..256, 1..576 with --kv-cache latent (default 64)" "--mask none|causal|window  (default none)" \
    "(default 2, 8, as many as --heads)" "--seqlen-k N   (default 1000)"; do
    lines "$text" 1
done

# ---- packed sequences and a KV cache: their options, and what they do not go with ----
expect 0 "--lengths L,L,..." check --help
expect 0 "--page-size N" check --help
expect 0 "--kv-cache: decoding steps" bench --help
expect 2 "--lengths 3,4 needs --varlen" check --lengths 3,4
expect 2 "--batch 2 and --lengths 3,4: the lengths listed are the batch" \
    check --varlen --batch 2 --lengths 3,4
expect 2 "--seqlen-k 9 and --lengths=3,4: the longest of the lengths listed is the maximum" \
    check --varlen --seqlen-k 9 --lengths=3,4
expect 2 "--lengths 3:x: 'x' is not a whole number" check --varlen --lengths 3:x
expect 2 "--lengths -1: must be in 0.." check --varlen --lengths -1
for option in "--cache-len 5" "--new 1" "--page-size 16" "--splits 2"; do
    expect 2 "$option needs --kv-cache" check $option
done
expect 2 "--page-size 16 needs --kv-cache" bench --page-size 16
expect 2 "--splits 2 needs --kv-cache" bench --varlen --splits 2
for command in "check" "bench" "plan --target h100"; do
    expect 2 "--kv-cache is a decoding step, forward only: it takes no --backward" \
        $command --kv-cache --backward
done
expect 2 "--kv-cache: a decoding step takes no dropout" check --kv-cache --dropout
expect 2 "--kv-cache: a decoding step takes no packed sequences (varlen)" check --kv-cache --varlen
expect 2 "--kv-cache: head dim 60; a decoding step needs a multiple of 8" bench --kv-cache -d 60
expect 2 "--seqlen 8: a decoding step takes --seqlen-q (queries per sequence, default 1)" \
    check --kv-cache --seqlen 8
expect 2 "--seqlen-k 100: fewer rows than the 304 keys a sequence holds after the step" \
    check --kv-cache --cache-len 300,2 --new 4 --seqlen-k 100
expect 2 "--new 2000: more rows than the 1000 a sequence may hold" check --kv-cache --new 2000
expect 2 "--batch 3 and --cache-len 5,6: the lengths listed are the batch" \
    check --kv-cache --batch 3 --cache-len 5,6
expect 2 "bench --varlen has a table of its own: it takes no --csv" bench --varlen --csv
expect 2 "bench --kv-cache has a table of its own: it takes no --tuned" bench --kv-cache --tuned
expect 2 "bench does not take --new 1" bench --kv-cache --new 1
expect 2 "tune does not take --varlen" tune --varlen

# ---- the scores' variants: --softcap X, --alibi [head|batch], --sinks ----
expect 0 "--alibi [head|batch]" check --help
expect 0 "--softcap X" plan --help
expect 0 "--sinks WHICH" bundle build --help
expect 2 "--softcap 0: the cap must be a positive number" plan --target h100 --softcap 0
expect 2 "--softcap=-2: the cap must be a positive number" check --softcap=-2
expect 2 "--softcap 1e-60: the cap must be a positive number" check --softcap 1e-60
expect 2 "--softcap inf: 'inf' is not a number" check --softcap inf
expect 2 "--softcap needs a value" plan --target h100 --softcap
expect 2 "--alibi=diagonal: unknown value 'diagonal'; valid: head, batch" plan --target h100 --alibi=diagonal
expect 2 "unexpected argument 'diagonal'" check --alibi diagonal
expect 2 "--sinks takes no value (given '--sinks=2')" check --sinks=2
for command in "plan --target h100" "source --target h100" "compile --target h100" "tune"; do
    expect 2 "--alibi batch: slopes per batch are launch arguments" $command --alibi batch
done
expect 2 "--alibi=batch: slopes per batch are launch arguments" plan --target h100 --alibi=batch
for option in "--softcap 30" "--alibi" "--alibi batch" "--sinks"; do
    expect 2 "bench does not take $option (see" bench $option
done
expect 2 "tune --standard tunes the benchmark's specs: it takes no --softcap 30" tune --standard --softcap 30
expect 2 "tune --standard tunes the benchmark's specs: it takes no --sinks" tune --standard --sinks
expect 2 "--softcap maybe: bad value; valid: both, on, off" bundle build --out "$tmp/b" --softcap maybe
expect 2 "--alibi=1: bad value; valid: both, on, off" bundle build --out "$tmp/b" --alibi=1
with="FLASHGEN_NVRTC=/nonexistent"
expect 0 "// fg_fwd_sm90a_fp16_d64_cap_" source --target h100 -d 64 --softcap 30
expect 0 "kernel   fg_fwd_sm90a_fp16_d64_causal_cap_alibi_sink_" \
    plan --target h100 -d 64 --mask causal --softcap 50 --alibi --sinks
expect 0 "kernel   fg_fwd_sm90a_fp16_d64_alibi_" plan --target h100 --alibi head
expect 0 "kernel   fg_fwd_sm90a_fp16_d64_alibi_" plan --target h100 --alibi=head
expect 0 "_alibi_sink_kvcache_" plan --target h100 --kv-cache --alibi --sinks
expect 0 "kernel   fg_bwd_sm80_fp16_d64_cap_sink_" plan --target a100 --backward --softcap 1 --sinks
with=""

# ---- expressions: --score-mod, --mask-mod, --aux ----
expect 0 "--score-mod EXPR" plan --help
expect 0 "--aux NAME:TYPE:SIZES" check --help
with="FLASHGEN_NVRTC=/nonexistent"
expect 0 "// score modifier: t = s + bias[h, q - k + 100]" source --target h100 -d 64 \
    --score-mod "s + bias[h,q-k+100]" --aux bias:f32:4x201
lines "fg_mask_mod(" 0
expect 0 "// mask predicate: key k visible to query q iff doc[q] == doc[k]" source --target a100 \
    --mask-mod "doc[q] == doc[k]" --aux doc:i32:300 --backward
# the same expression spelled twice alike: one kernel name
expect 0 "kernel   fg_fwd_sm90a_fp16_d64_s" plan --target h100 --score-mod "s * 2.0"
name1=$(grep "^kernel" "$tmp/out")
expect 0 "kernel   fg_fwd_sm90a_fp16_d64_s" plan --target h100 --score-mod "(s)*2."
name2=$(grep "^kernel" "$tmp/out")
[ "$name1" = "$name2" ] && passed=$((passed + 1)) || fail "'s * 2.0' and '(s)*2.' name different kernels"
expect 0 "kernel   fg_fwd_sm90a_fp16_d64_s" plan --target h100 --score-mod "s * 3.0"
[ "$(grep "^kernel" "$tmp/out")" != "$name1" ] && passed=$((passed + 1)) ||
    fail "'s * 3.0' and 's * 2.0' share a kernel name"
expect 0 "_sm" plan --target h100 --kv-cache --score-mod "s - abs(q - k)" --mask-mod "k > 0"
with=""
expect 2 "--score-mod s + bias[h, q; 1]: column 14: unexpected character ';'" plan --target h100 \
    --score-mod "s + bias[h, q; 1]" --aux bias:f32:4x201
expect 2 "--score-mod s + y[q]: column 5: unknown name 'y'" plan --target h100 --score-mod "s + y[q]"
expect 2 "--mask-mod s > 0: column 1: 's' (the score) is not available in a mask expression" \
    plan --target h100 --mask-mod "s > 0"
expect 2 "a score modifier replaces softcap" plan --target h100 --score-mod "s" --softcap 30
expect 2 "no score_mod or mask_mod reads them" plan --target h100 --aux bias:f32:4
expect 2 "--aux x:f64:3: the type is f32 or i32" plan --target h100 --aux x:f64:3
expect 2 "--aux bias:f32:4x: sizes 0..2^31-1, one to three" plan --target h100 --aux bias:f32:4x
expect 2 "--aux b:f32:1x2x3x4: sizes 0..2^31-1, one to three" plan --target h100 --aux b:f32:1x2x3x4
expect 2 "--aux bias: --aux takes NAME:TYPE:SIZES" plan --target h100 --aux bias
expect 2 "the same option twice" plan --target h100 --score-mod s --score-mod "s * 2.0"
expect 2 "bench does not take --score-mod s (see" bench --score-mod s
# a bundle ships expression kernels: found by their canonical form, with no NVRTC
expect 0 "1 of 1 kernels" bundle build --out "$tmp/bx" --target h100 --head-dims 64 --dtypes bf16 --dropout off \
    --masks none --passes forward --score-mod "s + bias[h, q - k + 100]" --aux bias:f32:4x201 -j 1
with="FLASHGEN_BUNDLE_PATH=$tmp/bx FLASHGEN_NVRTC=/nonexistent FLASHGEN_CACHE=off"
expect 0 "bundle" compile --target h100 -d 64 --dtype bf16 --score-mod "s+bias[h,q-k+100]" \
    --aux bias:f32:9x9
with=""
# block masks: the build's kernel, planned from the predicate alone, shipped beside the forward
with="FLASHGEN_NVRTC=/nonexistent"
expect 0 "kernel   fg_blockmask_sm90_fp16_d64_m" plan --target h100 --sparsity layout \
    --sparse-block 128x128 --mask-mod "doc[q] == doc[k]" --aux doc:i32:300 --block-mask
with=""
expect 2 "--backward and --block-mask: one pass at a time" plan --target h100 --backward --block-mask
expect 1 "a block mask needs spec.mask_mod and spec.sparsity FG_SPARSE_LAYOUT" plan --target h100 \
    --mask-mod "k > 0" --block-mask
expect 1 "block masks are for dense batches: spec.varlen" plan --target h100 --varlen \
    --sparsity layout --sparse-block 64x64 --mask-mod "k > 0" --block-mask
expect 0 "1 of 1 kernels" bundle build --out "$tmp/bm" --target h100 --head-dims 64 --dtypes bf16 \
    --dropout off --masks causal --passes forward --sparsity layout --sparse-blocks 128x128 \
    --mask-mod "doc[q] == doc[k]" --aux doc:i32:300 -j 1
with="FLASHGEN_BUNDLE_PATH=$tmp/bm FLASHGEN_NVRTC=/nonexistent FLASHGEN_CACHE=off"
expect 0 "bundle" compile --target h100 -d 96 --sparsity layout --sparse-block 128x128 \
    --mask-mod "doc[q]==doc[k]" --aux doc:i32:8 --block-mask
with=""

# ---- a value head dim of its own: --head-dim-v ----
expect 0 "--head-dim-v N             the value head dim" plan --help
expect 0 "--head-dim-v N" check --help
expect 0 "--head-dim-v N" tune --help
expect 0 "--head-dim-v N" bench --help
expect 0 "--head-dims-v LIST" bundle build --help
with="FLASHGEN_NVRTC=/nonexistent"
# on an H100 the Hopper families take the pair
expect 0 "kernel   fg_fwd_sm90a_fp16_d192v128_" plan -d 192 --head-dim-v 128 --target h100
lines "dim 192, value head dim 128" 1
expect 0 "kernel   fg_bwd_sm90a_bf16_d192v128_causal_" plan -d 192 --head-dim-v=128 --dtype bf16 \
    --mask causal --backward --target h100
expect 0 "kernel   fg_fwd_sm80_fp16_d64v128_" plan -d 64 --head-dim-v 128 --target a100
expect 0 "kernel   fg_bwd_sm75_fp16_d96v64_" plan -d 96 --head-dim-v 64 --backward --target t4
# equal dims: the spec without one
expect 0 "kernel   fg_fwd_sm90a_fp16_d128_" plan -d 128 --head-dim-v 128 --target h100
expect 0 "// spec: fp16_d192v128 (dtype fp16, head dim 192, value head dim 128," \
    source -d 192 --head-dim-v 128 --target a100
# over a KV cache an H100's first family is the Hopper forward (chunked
# prefill); it hands the steps of a few queries to fwd_decode
expect 0 "kernel   fg_fwd_sm90a_fp16_d128_kvcache_m128n192" plan --kv-cache -d 128 --head-dim-v 128 \
    --target h100
with="FLASHGEN_FAMILIES=fwd_decode"
expect 0 "kernel   fg_decode_sm90_fp16_d128_kvcache_" plan --kv-cache -d 128 --head-dim-v 128 --target h100
with=""
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_FAMILIES=bwd_sm90a"
# above d = 128 the Hopper backward takes dropout in its split kernel
expect 0 "kernel   fg_bwd_sm90a_fp16_d192v128_drop_m64n64s2" plan -d 192 --head-dim-v 128 \
    --dropout --backward --target h100
with=""
expect 0 "fg_fwd_sm80_fp16_d192v128_" compile -d 192 --head-dim-v 128 --target a100
expect 0 "fg_bwd_sm80_bf16_d192v128_causal_" compile -d 192 --head-dim-v 128 --dtype bf16 \
    --mask causal --backward --target a100
expect 2 "flashgen: --head-dim-v 0: 0 is outside 1..256" plan --target h100 --head-dim-v 0
expect 2 "flashgen: --head-dim-v=257: 257 is outside 1..256" check --head-dim-v=257
expect 2 "flashgen: --head-dim-v -64: -64 is outside 1..256" bench --head-dim-v -64
expect 2 "--head-dim-v 2x: '2x' is not a whole number" tune --head-dim-v 2x
expect 2 "--head-dim-v needs a value" plan --target h100 --head-dim-v
expect 2 "--head-dim-v 64 and --head-dim-v=128: the same option twice; give it once" \
    plan --target h100 --head-dim-v 64 --head-dim-v=128
expect 2 "--head-dim-v  64: ' 64' has white space in it" check --head-dim-v " 64"
# a latent cache: -d 576 --head-dim-v 512 by default; fwd_mla_sm90a on an H100, fwd_mla elsewhere
expect 0 "kernel   fg_mla_sm90a_bf16_d576v512_kvlatent_wg" plan --target h100 --kv-cache latent \
    --dtype bf16
expect 0 "kernel   fg_mla_sm80_fp16_d192v128_causal_kvlatent_" plan --target a100 --kv-cache=latent \
    -d 192 --head-dim-v 128 --mask causal
expect 2 "flashgen: --kv-cache=bogus: unknown value 'bogus'; valid: latent" plan --target h100 \
    --kv-cache=bogus
expect 2 "a latent cache takes no softcap" plan --target h100 --kv-cache latent --softcap 30
expect 1 "bytes of shared memory" plan --target t4 --kv-cache latent
# a decoding step takes a value head dim of its own, a multiple of 8
with="FLASHGEN_FAMILIES=fwd_decode"
expect 0 "kernel   fg_decode_sm90_fp16_d192v128_kvcache_" plan --kv-cache -d 192 --head-dim-v 128 \
    --target h100
with=""
expect 0 "// spec: fp16_d64v32_kvcache (dtype fp16, head dim 64, value head dim 32," \
    source --target a100 --kv-cache --head-dim-v 32
expect 0 "fg_decode_sm80_bf16_d128v64_kvcache_" compile --kv-cache -d 128 --head-dim-v 64 \
    --dtype bf16 --target a100
expect 2 "flashgen: --kv-cache: value head dim 36; a decoding step needs a multiple of 8" \
    plan --target h100 --kv-cache -d 64 --head-dim-v 36
expect 2 "bench --philox times the forward's parts alone: it takes no --head-dim-v 64" \
    bench --philox --head-dim-v 64
expect 2 "tune --standard tunes the benchmark's specs: it takes no --head-dim-v 64" \
    tune --standard --head-dim-v 64
expect 2 "bundle build: --head-dims-v 0: bad value; valid: N, FIRST:LAST" \
    bundle build --out "$tmp/b" --head-dims-v 0
expect 2 "bundle build: unknown option --head-dim-v; it takes lists, --head-dims and --head-dims-v" \
    bundle build --out "$tmp/b" --head-dim-v 128
expect 2 "--head-dims-v 64 and --head-dims-v=32: the same option twice" \
    bundle build --out "$tmp/b" --head-dims-v 64 --head-dims-v=32
# a bundle of both dims, found by a call of them with no NVRTC; 128/128 is the plain spec
expect 0 "2 of 2 kernels" bundle build --out "$tmp/bv" --target a100 --head-dims 128,192 \
    --head-dims-v 128 --dtypes bf16 --masks causal --dropout off --passes forward -j 2
lines "fg_fwd_sm80_bf16_d192v128_causal_" 1
lines "fg_fwd_sm80_bf16_d128_causal_" 1
with="FLASHGEN_BUNDLE_PATH=$tmp/bv FLASHGEN_NVRTC=/nonexistent FLASHGEN_CACHE=off"
expect 0 "bundle" compile --target a100 -d 192 --head-dim-v 128 --dtype bf16 --mask causal
with=""

# ---- --opt=value, and flags named as typed ----
with="FLASHGEN_NVRTC=/nonexistent"
expect 0 "kernel   fg_fwd_sm90a_bf16_d128_causal_" plan --target h100 --dtype bf16 -d 128 --mask causal
cp "$tmp/stdout" "$tmp/spaced"
expect 0 "kernel   fg_fwd_sm90a_bf16_d128_causal_" plan --target=h100 --dtype=bf16 --head-dim=128 --mask=causal
cmp -s "$tmp/stdout" "$tmp/spaced" && passed=$((passed + 1)) || fail "--opt=value planned otherwise"
with=""
expect 2 "plan does not take --seqlen=5" plan --target h100 --seqlen=5
expect 2 "flashgen: -d 300: 300 is outside 1..256" plan --target h100 -d 300
expect 2 "flashgen: --head-dim=300: 300 is outside 1..256" plan --target h100 --head-dim=300
expect 2 "flashgen: --head-dim 0: 0 is outside 1..256" check --head-dim 0
expect 2 "flashgen: -d 512: 512 is outside 1..256" bench -d 512
expect 2 "--sparse-block 40x64: 40 x 64" plan --target h100 --sparsity layout --sparse-block 40x64
expect 2 "--seqlen abc: 'abc' is not a whole number" check --seqlen abc
expect 2 "--seqlens=0,512: must be in 1.." tune --seqlens=0,512

# ---- what is ambiguous is refused: an option twice, --seqlen beside --seqlen-q/-k, white space ----
expect 2 "flashgen: -d 64 and --head-dim 128: the same option twice; give it once" \
    plan --target h100 -d 64 --head-dim 128
expect 2 "--mask causal and --mask=none: the same option twice" plan --target h100 --mask causal --mask=none
expect 2 "--dropout and --dropout: the same option twice" plan --target h100 --dropout --dropout
expect 2 "--seqlen 128 and --seqlen 256: the same option twice" check --seqlen 128 --seqlen 256
expect 2 "--seqlen 128 and --seqlen-q 64: --seqlen sets both lengths" check --seqlen 128 --seqlen-q 64
expect 2 "--seqlen=128 and --seqlen-k 64: --seqlen sets both lengths" check --seqlen-k 64 --seqlen=128
expect 2 "-d  64: ' 64' has white space in it" check -d " 64"
expect 2 "--seqlen 64 : '64 ' has white space in it" check --seqlen "64 "
expect 2 "--lengths=3, 4: '3, 4' has white space in it" check --varlen "--lengths=3, 4"
expect 2 "--window  8,0: ' 8,0' has white space in it" check --mask window --window " 8,0"
expect 2 "--head-dims  64: ' 64' has white space in it" bundle build --out "$tmp/b" --head-dims " 64"
expect 2 "-j 2 and --jobs 3: the same option twice" bundle build --out "$tmp/b" --target t4 -j 2 --jobs 3
expect 2 "--dtypes fp16 and --dtypes bf16: the same option twice" \
    bundle build --out "$tmp/b" --dtypes fp16 --dtypes bf16
expect 2 "--arch 90 and --arch 80: the same option twice" cache list --arch 90 --arch 80
expect 2 "--target t4 and --target=h100: the same option twice" bundle verify "$tmp" --target t4 --target=h100
expect 2 "--arch  90: ' 90' has white space in it" cache list --arch " 90"
# --target is the one option given more than once: each is a target
with="FLASHGEN_NVRTC=/nonexistent"
expect 0 "target   a100" plan --target h100 --target a100 -d 64
with=""

# ---- a bad enumeration lists the valid values ----
expect 2 "--target x100: unknown target 'x100'; valid: t4, a100, rtx3090, l4, h100" plan --target x100
expect 2 "--target=x100: unknown target 'x100'; valid: t4, a100, rtx3090, l4, h100" plan --target=x100
expect 2 "--dtype fp32: unknown value 'fp32'; valid: fp16, bf16" plan --target h100 --dtype fp32
expect 2 "valid: none, causal, window" plan --target h100 --mask diagonal
expect 2 "valid: none, layout, butterfly" plan --target h100 --sparsity dense
expect 2 "valid: bshd, bhsd" check --layout sbhd
expect 2 "valid: bottom-right, top-left" check --mask causal --align middle
expect 2 "--dtypes fp8: bad value; valid: fp16, bf16" bundle build --out "$tmp/b" --dtypes fp8
expect 2 "--target=x100: bad value; valid: t4, a100, rtx3090, l4, h100" bundle build --out "$tmp/b" --target=x100
expect 2 "valid: list, stats, verify, clear" cache lst
expect 2 "unknown target; valid: t4, a100, rtx3090, l4, h100" bundle verify "$tmp" --target=x100

# ---- without a GPU: arguments first, then what works offline ----
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "a GPU is present: the no-GPU messages are not checked"
else
    for command in check bench tune; do
        expect 1 "flashgen: $command needs a CUDA GPU" $command
        lines "plan, source, compile and bundle work" 1
    done
    expect 1 "check needs a CUDA GPU" check -d 64 --mask window --window 16,0 --seqlen 128 --batch=1
    expect 1 "bench needs a CUDA GPU" bench --quick -d 128 --seqlen=4096
    expect 1 "tune needs a CUDA GPU" tune --standard --seqlens 4096
    expect 1 "check needs a CUDA GPU" check --varlen --lengths 0,1,77:300,300 --mask causal --backward
    expect 1 "check needs a CUDA GPU" check --varlen --batch 5 --seqlen-q 300 --seqlen-k 200 \
        --dropout --dropout-p 0.1 --layout bhsd
    expect 1 "check needs a CUDA GPU" check --kv-cache --page-size 3 --cache-len 0,17,300 --new 2 \
        --splits 4 --seqlen-q 4 --heads 16 --kv-heads 2 --dtype bf16 -d 128
    expect 1 "check needs a CUDA GPU" check --kv-cache --batch 3 --seqlen-k 500 --new 3 --mask causal
    expect 1 "check needs a CUDA GPU" check --softcap 2 --alibi batch --sinks --mask causal --backward
    expect 1 "check needs a CUDA GPU" check --varlen --lengths 3,0,9 --alibi batch --sinks --backward
    expect 1 "check needs a CUDA GPU" check --kv-cache --cache-len 5,0 --alibi --sinks --softcap 1.5
    expect 1 "bench needs a CUDA GPU" bench --varlen --backward --quick -d 64
    expect 1 "bench needs a CUDA GPU" bench --kv-cache --page-size 16 --splits 0 --seqlen 4096
    expect 1 "check needs a CUDA GPU" check -d 192 --head-dim-v 128 --mask causal --backward
    expect 1 "check needs a CUDA GPU" check --varlen --lengths 0,77:300 -d 64 --head-dim-v 128 --backward
    expect 1 "check needs a CUDA GPU" check --kv-cache -d 128 --head-dim-v 128
    expect 1 "check needs a CUDA GPU" check --kv-cache -d 192 --head-dim-v 128
    expect 1 "check needs a CUDA GPU" check --kv-cache latent --page-size 64 --seqlen-q 2
    expect 1 "bench needs a CUDA GPU" bench --kv-cache latent --quick
    expect 1 "bench needs a CUDA GPU" bench --kv-cache --head-dim-v 64
    expect 1 "bench needs a CUDA GPU" bench -d 192 --head-dim-v 128 --backward --tuned --csv
    expect 1 "bench needs a CUDA GPU" bench --varlen --head-dim-v 64 --quick
    expect 1 "bench needs a CUDA GPU" bench --variants --quick --head-dim-v 128
    expect 1 "tune needs a CUDA GPU" tune -d 192 --head-dim-v 128 --backward
    expect 1 "so it takes no options" demo --head-dim-v 64
    expect 1 "name a target with --target (t4, a100, rtx3090, l4, h100)" plan
    expect 1 "so it takes no options" demo -d 64
fi

# ---- cache --dir of a missing folder ----
expect 1 "--dir $tmp/missing: no such folder" cache list --dir "$tmp/missing"
[ ! -e "$tmp/missing" ] && passed=$((passed + 1)) || fail "cache list made $tmp/missing"
expect 1 "no such folder" cache clear --dir="$tmp/missing"
: >"$tmp/file"
expect 1 "--dir $tmp/file: not a folder" cache stats --dir "$tmp/file"
mkdir "$tmp/empty"
expect 0 "0 entries" cache list --dir="$tmp/empty"
# FLASHGEN_CACHE_DIR names a folder as --dir does: a missing one is refused, not made
with="FLASHGEN_CACHE_DIR=$tmp/typo/cache"
expect 1 "cache: FLASHGEN_CACHE_DIR=$tmp/typo/cache: no such folder" cache clear
[ ! -e "$tmp/typo" ] && passed=$((passed + 1)) || fail "cache clear made $tmp/typo"
with="FLASHGEN_CACHE_DIR=$tmp/file"
expect 1 "FLASHGEN_CACHE_DIR=$tmp/file: not a folder" cache stats
with="FLASHGEN_CACHE_DIR=$tmp/typo/cache"
expect 0 "0 entries" cache list --dir "$tmp/empty"
with=""

# ---- cache --arch: a target flashgen builds for, or one the cache holds ----
expect 2 "cache: --arch 99: sm_99 is no target of flashgen's or of this cache; valid: sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a" \
    cache list --arch 99 --dir "$tmp/empty"
expect 2 "valid: sm_75," cache clear --arch=sm_99 --dir "$tmp/empty"
expect 0 "0 entries" cache list --arch 90a --dir "$tmp/empty"
mkdir "$tmp/empty/sm_120"
expect 0 "0 entries" cache list --arch 120 --dir "$tmp/empty"
rmdir "$tmp/empty/sm_120"

# ---- bundle build: the whole default set only when asked for by name ----
expect 2 "no option chooses the kernels, so this would build every default: " bundle build --out "$tmp/all"
expect 2 "say --all for that" bundle build --out "$tmp/all" -j 2
[ ! -e "$tmp/all" ] && passed=$((passed + 1)) || fail "bundle build made $tmp/all"
expect 2 "--all and --head-dims 64: --all builds every default" bundle build --out "$tmp/all" --all --head-dims 64
expect 2 "--all and --all-targets: --all builds every default" bundle build --out "$tmp/all" --all-targets --all
expect 0 "  --all              every default" bundle build --help

# ---- a bundle build that selects nothing ----
expect 2 "the options select no kernel to build" \
    bundle build --out "$tmp/none" --target t4 --dtypes bf16 --head-dims 64
lines "skipped on t4: --dtypes: bf16 needs sm_80" 1
[ ! -e "$tmp/none" ] && passed=$((passed + 1)) || fail "bundle build made $tmp/none"
# (the selection kept to one kernel, should the option be taken after all)
expect 2 "--sparse-blocks 64x32 needs --sparsity layout or butterfly" \
    bundle build --out "$tmp/none" --sparse-blocks 64x32 --target t4 --head-dims 8 --dtypes fp16 \
    --masks none --dropout off --passes forward

# ---- environment values: one warning each, never a failure ----
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_CACHE=0"
expect 0 "flashgen: warning: FLASHGEN_CACHE=0 is not understood (only 'off' is)" plan --all-targets
lines "FLASHGEN_CACHE=0" 1
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_TUNING=no"
expect 0 "flashgen: warning: FLASHGEN_TUNING=no is not understood (only 'off' is)" plan --all-targets
lines "FLASHGEN_TUNING=no" 1
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_BUNDLE_PATH=$tmp/missing::$tmp"
expect 0 "FLASHGEN_BUNDLE_PATH: bundle folder $tmp/missing: not a folder (passed over)" plan --all-targets
lines "flashgen: warning: FLASHGEN_BUNDLE_PATH" 1
lines "bundle folder $tmp has no manifest.tsv" 1
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_COMPILE_LOG=yes"
expect 0 "FLASHGEN_COMPILE_LOG=yes is not understood" plan --all-targets
lines "FLASHGEN_COMPILE_LOG" 1
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_FAMILIES=fwd_sm80,nope"
expect 0 "FLASHGEN_FAMILIES: no family 'nope' (fwd_sm90a, fwd_decode, fwd_mla_sm90a, fwd_mla, fwd_sm80, bwd_sm90a, bwd_sm80, block_mask): ignored" plan --target h100 -d 128
lines "FLASHGEN_FAMILIES" 1
# docs/command-line.md's table names the same families
families=$(sed -n "s/.*no family 'nope' (\(.*\)): ignored.*/\1/p" "$tmp/out" | sed 's/[a-z0-9_][a-z0-9_]*/`&`/g')
grep -F 'FLASHGEN_FAMILIES=F,F' "$(dirname "$0")/../docs/command-line.md" | grep -qF "($families)" &&
    passed=$((passed + 1)) || fail "docs/command-line.md's FLASHGEN_FAMILIES row does not name ($families)"
# ---- FLASHGEN_FAMILIES keeps a pass to the families it names ----
lines "kernel   fg_fwd_sm90_fp16_d128_" 1
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_FAMILIES=bwd_sm80"
expect 0 "kernel   fg_fwd_sm90a_fp16_d128_" plan --target h100 -d 128
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_FAMILIES=fwd_sm90a"
expect 1 "no kernel family runs the forward pass on a100 (sm_80) among those FLASHGEN_FAMILIES names" plan --target a100 -d 128
with="FLASHGEN_NVRTC=/nonexistent FLASHGEN_CACHE=off FLASHGEN_TUNING=off"
expect 0 "" plan --target h100
[ ! -s "$tmp/stderr" ] && passed=$((passed + 1)) || fail "FLASHGEN_CACHE=off warned"
with=""

# ---- source --all-targets ----
expect 0 "// flashgen source: t4 (" source --all-targets -d 64
for target in t4 a100 rtx3090 l4 h100; do lines "// flashgen source: $target (" 1; done

# ---- plan shows the plan that runs: rtx3090's fp16 d=96 causal forward
# spills with its derived tiles and is re-planned ----
with="FLASHGEN_NVRTC=/nonexistent"
expect 0 "note     the derived plan, not compiled" plan --target rtx3090 -d 96 --mask causal
expect 0 "if ptxas spills with it, compiling re-plans" plan --target rtx3090 -d 96 --mask causal
with=""
expect 0 "" plan --target rtx3090 -d 96 --mask causal
if grep -q "not compiled" "$tmp/out"; then
    echo "NVRTC could not be loaded: the re-planned plan is not checked"
else
    lines "re-planned under a budget" 1
    kernel=$(sed -n 's/^kernel   //p' "$tmp/stdout")
    expect 0 "$kernel" compile --target rtx3090 -d 96 --mask causal
    # compiled before: the table says cached, not a compile time of 0ms
    expect 0 "   cached  disk cache" compile --target rtx3090 -d 96 --mask causal
    lines "0ms" 0
fi

echo "test_cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]

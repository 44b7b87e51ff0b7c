"""Score and mask expressions against FlexAttention with the same functions,
in the same run: a learned relative bias (score_mod s + bias[h, q - k + S - 1])
and a document mask (8 documents of random lengths in one sequence of 16k
tokens), forward and forward+backward, bf16, 16 heads, d 128, 16k tokens per
batch (seqlen 8k and 2k). Both block masks (Flex's create_block_mask and
flashgen's) are built once, outside the timing, and their build times
printed apart; the document mask is also timed without a block mask (the
predicate tested on every tile) and as the same work as a varlen call
(attention_varlen over the documents; also FlashAttention 4's varlen call
where flash-attn-4 is importable). Prints times and the ratios
other/flashgen (above 1: flashgen faster).

usage: python3 bench/expressions.py [--quick]  (the flashgen package importable, a GPU)
"""
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

import flashgen  # noqa: E402
from sdpa import fa4, fa4_out, time_ms  # noqa: E402

# one compiled Flex per shape and mask function: more than dynamo's default of 8
for _limit in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _limit):
        setattr(torch._dynamo.config, _limit, 64)
flex = torch.compile(flex_attention, dynamic=False)
HEADS, D = 16, 128


def qkv(batch, seqlen, grad):
    # (B, H, S, D) as Flex takes them
    return [torch.randn(batch, HEADS, seqlen, D, device="cuda", dtype=torch.bfloat16,
                        requires_grad=grad) for _ in range(3)]


def timed(fn, backward, inputs):
    """Median ms of fn (and its backward), or None when it cannot run (Flex's
    backward fails to compile at some shapes); the reason is printed."""
    try:
        return timed_or_raise(fn, backward, inputs)
    except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
        print(f"    (not timed: {type(e).__name__}: {str(e).splitlines()[-1][:150]})")
        return None


def ratio(other, ours):
    return f"{other:7.3f} ({other / ours:4.2f}x)" if other and ours else "  -- (  -- )"


def timed_or_raise(fn, backward, inputs):
    if not backward:
        with torch.no_grad():
            return time_ms(fn, repeats=5)
    dout = torch.randn_like(inputs[0])

    def step():
        for x in inputs:
            x.grad = None
        fn().backward(dout)
    return time_ms(step, repeats=5)


def relative_bias(seqlen, backward):
    batch = 16384 // seqlen
    q, k, v = qkv(batch, seqlen, backward)
    bias = torch.randn(HEADS, 2 * seqlen - 1, device="cuda", dtype=torch.float32,
                       requires_grad=backward)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + seqlen - 1]
    ours = timed(lambda: flashgen.attention(
        q, k, v, layout="bhsd", score_mod="s + bias[h, q - k + seqlen_k - 1]",
        aux={"bias": bias}), backward, [q, k, v, bias])
    theirs = timed(lambda: flex(q, k, v, score_mod=score_mod), backward, [q, k, v, bias])
    plain = timed(lambda: flashgen.attention(q, k, v, layout="bhsd"), backward, [q, k, v])
    return ours, theirs, plain


def documents(seqlen, count, generator):
    cuts = torch.sort(torch.randint(1, seqlen, (count - 1,), generator=generator)).values
    lens = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([seqlen])])).tolist()
    doc = torch.repeat_interleave(torch.arange(count), torch.tensor(lens)).to("cuda", torch.int32)
    return doc, lens


def build_ms(make):
    """(what make() returns, the ms its build took on the GPU)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    made = make()
    end.record()
    end.synchronize()
    return made, start.elapsed_time(end)


def document_mask(seqlen, backward, causal):
    batch = 16384 // seqlen
    doc, lens = documents(seqlen, 8, torch.Generator().manual_seed(seqlen))
    q, k, v = qkv(batch, seqlen, backward)

    def mask_mod(b, h, q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same
    block_mask, flex_build = build_ms(
        lambda: create_block_mask(mask_mod, None, None, seqlen, seqlen, device="cuda"))
    flashgen.create_block_mask("doc[q] == doc[k]", None, None, seqlen, seqlen,
                               aux={"doc": doc})  # its kernel compiled before the timing
    ours_mask, our_build = build_ms(lambda: flashgen.create_block_mask(
        "doc[q] == doc[k]", None, None, seqlen, seqlen, aux={"doc": doc}))
    ours = timed(lambda: flashgen.attention(q, k, v, layout="bhsd", causal=causal,
                                            sparsity=ours_mask), backward, [q, k, v])
    tested = timed(lambda: flashgen.attention(q, k, v, layout="bhsd", causal=causal,
                                              mask_mod="doc[q] == doc[k]", aux={"doc": doc}),
                   backward, [q, k, v])
    theirs = timed(lambda: flex(q, k, v, block_mask=block_mask), backward, [q, k, v])
    # the same work packed: each batch row's documents as sequences of their own
    cu = torch.tensor([0] + lens * batch, device="cuda").cumsum(0).to(torch.int32)
    qp, kp, vp = (x.detach().transpose(1, 2).reshape(batch * seqlen, HEADS, D).requires_grad_(backward)
                  for x in (q, k, v))
    packed = timed(lambda: flashgen.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens),
                                                     causal=causal), backward, [qp, kp, vp])
    fa4v = fa4("flash_attn_varlen_func")
    fa4_packed = fa4v and timed(lambda: fa4_out(fa4v(
        qp, kp, vp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens),
        causal=causal)), backward, [qp, kp, vp])
    return ours, theirs, (packed, fa4_packed), tested, (our_build, flex_build)


def main():
    quick = "--quick" in sys.argv[1:]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashgen {flashgen.__version__}")
    print(f"bf16, H{HEADS} d{D}, 16k tokens; times in ms; ratio = other / flashgen")
    for seqlen in ((8192,) if quick else (8192, 2048)):
        for backward in (False, True):
            what = "fwd+bwd" if backward else "fwd"
            ours, theirs, plain = relative_bias(seqlen, backward)
            print(f"rel bias     {seqlen:5d} {what:7s} flashgen {ours:7.3f}  flex {ratio(theirs, ours)}"
                  f"  plain flashgen {ratio(plain, ours)}")
            for causal in (False, True):
                ours, theirs, packed, tested, build = document_mask(seqlen, backward, causal)
                print(f"docs{' causal' if causal else '       '} {seqlen:5d} {what:7s} flashgen "
                      f"{ours:7.3f}  flex {ratio(theirs, ours)}  varlen {ratio(packed[0], ours)}"
                      + (f"  FA4 varlen {ratio(packed[1], ours)}" if fa4("flash_attn_varlen_func") else "")
                      + f"  no block mask {ratio(tested, ours)}  block masks built in "
                      f"{build[0]:.2f} ms (flashgen), {build[1]:.2f} ms (flex)")


if __name__ == "__main__":
    main()

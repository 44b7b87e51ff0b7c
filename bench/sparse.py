"""Butterfly block sparsity against flashgen's dense attention and
FlexAttention with the same block mask, in the same run, the forward and
then forward+backward: bf16, batch 2, 16 heads, d 128, seqlen 8192, 128 x 128
blocks; with 6 factors each query block keeps key blocks qb ^ x for x in
{0, 1, 2, 4, 8, 16, 32}: 7 of 64, density 0.109.

usage: python3 bench/sparse.py  (the flashgen package importable, a GPU)
"""
from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

import flashgen  # noqa: E402
from sdpa import time_ms  # noqa: E402


def main(batch=2, heads=16, seqlen=8192, d=128, block=128, factors=6):
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    blocks = seqlen // block
    density = (1 + factors) / blocks

    def kept(b, h, i, j):
        x = (i // block) ^ (j // block)
        return (x == 0) | (((x & (x - 1)) == 0) & (x < (1 << factors)))

    pattern = flashgen.Butterfly(factors, block)
    dense = time_ms(lambda: flashgen.attention(q, k, v))
    sparse = time_ms(lambda: flashgen.attention(q, k, v, sparsity=pattern))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    mask = create_block_mask(kept, None, None, seqlen, seqlen, BLOCK_SIZE=block)
    flex = torch.compile(flex_attention, dynamic=False)
    flex_ms = time_ms(lambda: flex(qt, kt, vt, block_mask=mask))

    # the same answer: flashgen's sparse output against Flex's
    diff = (flashgen.attention(q, k, v, sparsity=pattern) - flex(qt, kt, vt, block_mask=mask)
            .transpose(1, 2)).abs().max().item()
    flops = 4 * batch * heads * seqlen * seqlen * d * density
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"bf16 B{batch} H{heads} S{seqlen} d{d}, butterfly {factors} factors on {block}x{block} "
          f"blocks: density {density:.3f}")
    print(f"flashgen dense     {dense:8.3f} ms")
    print(f"flashgen butterfly {sparse:8.3f} ms  {flops / (sparse * 1e-3) / 1e12:6.1f} TFLOP/s (kept "
          f"blocks)  speedup over dense {dense / sparse:5.2f}x (1/density {1 / density:.2f}, "
          f"{dense / sparse * density:.2f} of it)")
    print(f"flex, same mask    {flex_ms:8.3f} ms  {flops / (flex_ms * 1e-3) / 1e12:6.1f} TFLOP/s  "
          f"flashgen {flex_ms / sparse:5.2f}x faster")
    print(f"largest |flashgen - flex| {diff:.3g}")

    # forward+backward (3.5x the forward's FLOPs); q, k, v as (B, S, H, D)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    dout = torch.randn_like(q)

    def train(attend):
        return lambda: torch.autograd.grad(attend(), (qg, kg, vg), dout)

    def flex_bshd():
        return flex(*(x.transpose(1, 2) for x in (qg, kg, vg)), block_mask=mask).transpose(1, 2)

    dense_fb = time_ms(train(lambda: flashgen.attention(qg, kg, vg)))
    sparse_fb = time_ms(train(lambda: flashgen.attention(qg, kg, vg, sparsity=pattern)))
    flex_fb = time_ms(train(flex_bshd))
    grads = train(lambda: flashgen.attention(qg, kg, vg, sparsity=pattern))()
    flex_grads = train(flex_bshd)()
    gdiff = max((a - b).abs().max().item() for a, b in zip(grads, flex_grads))
    print("forward+backward")
    print(f"flashgen dense     {dense_fb:8.3f} ms")
    print(f"flashgen butterfly {sparse_fb:8.3f} ms  {3.5 * flops / (sparse_fb * 1e-3) / 1e12:6.1f} "
          f"TFLOP/s (kept blocks)  speedup over dense {dense_fb / sparse_fb:5.2f}x "
          f"({dense_fb / sparse_fb * density:.2f} of 1/density)")
    print(f"flex, same mask    {flex_fb:8.3f} ms  {3.5 * flops / (flex_fb * 1e-3) / 1e12:6.1f} "
          f"TFLOP/s  flashgen {flex_fb / sparse_fb:5.2f}x faster")
    print(f"largest |flashgen - flex| of dQ, dK, dV {gdiff:.3g}")


if __name__ == "__main__":
    main()

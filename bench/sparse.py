"""Butterfly block sparsity against flashgen's dense forward and FlexAttention
with the same block mask, in the same run: bf16, batch 2, 16 heads, d 128,
seqlen 8192, 128 x 128 blocks; with 6 factors each query block keeps key
blocks qb ^ x for x in {0, 1, 2, 4, 8, 16, 32}: 7 of 64, density 0.109.

usage: python3 bench/sparse.py  (the flashgen package importable, a GPU)
"""
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flashgen
from sdpa import time_ms  # bench/, the script's folder


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


if __name__ == "__main__":
    main()

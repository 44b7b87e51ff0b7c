"""fp64 attention on the GPU: the reference of the GPU tests.

Tensors are (B, S, H, D); keep is an optional (B, H, Sq, Sk) dropout mask
and blocks an optional (H or 1, blocks_q, blocks_k) block mask. Rows with no
visible key give 0 (and lse -inf), as flashgen does."""
import torch


def visible(sq, sk, causal=False, align="bottom-right", window=None, device="cuda"):
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = sk - sq if align == "bottom-right" else 0
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal:
        ok &= j <= i + off
    if window is not None:
        left, right = window
        if causal:
            right = 0
        if left >= 0:
            ok &= j >= i + off - left
        if right >= 0:
            ok &= j <= i + off + right
    return ok


def attention(q, k, v, *, causal=False, align="bottom-right", window=None, scale=None,
              keep=None, dropout_p=0.0, blocks=None, block_size=None, dtype=torch.float64):
    """Returns (out (B, Sq, Hq, D), lse (B, Hq, Sq)) computed in dtype."""
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    qd = q.to(dtype).transpose(1, 2)
    kd = k.to(dtype).transpose(1, 2).repeat_interleave(Hq // Hk, dim=1)
    vd = v.to(dtype).transpose(1, 2).repeat_interleave(Hq // Hk, dim=1)
    s = (qd @ kd.transpose(-1, -2)).float() * scale if dtype != torch.float64 else \
        (qd @ kd.transpose(-1, -2)) * scale
    ok = visible(Sq, Sk, causal, align, window, q.device)
    if blocks is not None:
        bq, bk = block_size
        b = torch.as_tensor(blocks, dtype=torch.bool, device=q.device)
        b = b.repeat_interleave(bq, 1).repeat_interleave(bk, 2)[:, :Sq, :Sk]
        ok = ok & b
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    if keep is not None:
        p = p * keep / (1 - dropout_p)
    out = (p.to(dtype) @ vd).transpose(1, 2)
    return out, lse


def error(a, ref):
    return (a.double() - ref.double()).abs().max().item()

"""fp64 attention on the GPU: the reference of the GPU tests.

Tensors are (B, S, H, D); keep is an optional (B, H, Sq, Sk) dropout mask,
blocks an optional (H or 1, blocks_q, blocks_k) block mask and mask an
optional (B or 1, Sq, Sk) boolean one (a mask_mod's values). Rows with no
visible key give 0 (and lse -inf, or the sink's logit with sinks), as
flashgen does."""
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


def scores(q, k, v, scale, dtype):
    """(v heads first in dtype, repeated for each query head of its group:
    (B, Hq, Sk, Dv); the scores scale·q·kᵀ (B, Hq, Sq, Sk), fp32 from a low
    precision dtype as a framework computes them). scale None: 1/sqrt(D)."""
    Hq, Hk, D = q.shape[2], k.shape[2], q.shape[3]
    scale = D ** -0.5 if scale is None else scale
    qd = q.to(dtype).transpose(1, 2)
    kd = k.to(dtype).transpose(1, 2).repeat_interleave(Hq // Hk, dim=1)
    vd = v.to(dtype).transpose(1, 2).repeat_interleave(Hq // Hk, dim=1)
    s = qd @ kd.transpose(-1, -2)
    return vd, s.float() * scale if dtype != torch.float64 else s * scale


def attention(q, k, v, *, causal=False, align="bottom-right", window=None, scale=None,
              keep=None, dropout_p=0.0, blocks=None, block_size=None, softcap=None,
              alibi_slopes=None, sinks=None, mask=None, dtype=torch.float64):
    """Returns (out (B, Sq, Hq, D), lse (B, Hq, Sq)) computed in dtype.

    The scores' variants, from their definition: with s = scale·q·k, the
    softmax of row i sees t = softcap·tanh(s/softcap) − slope[b, h]·|i + off
    − j| (off = Sk − Sq bottom-right, 0 top-left, with or without a mask)
    over its visible keys, and with sinks one more logit sinks[h] that
    joins the max and the sum and carries no value (the softmax of the
    scores with a column of the sink appended, the column then dropped).
    alibi_slopes (Hq,) or (B, Hq); sinks (Hq,), differentiable. In a low
    precision dtype they act on the fp32 scores, as a framework computes
    them (an fp32 bias or parameter promotes the scores)."""
    B, Sq, Hq, D = q.shape
    Sk = k.shape[1]
    vd, s = scores(q, k, v, scale, dtype)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(s.dtype).reshape(-1, Hq, 1, 1)
        s = s - slopes * distances(Sq, Sk, align, q.device).to(s.dtype)
    ok = visible(Sq, Sk, causal, align, window, q.device)
    if blocks is not None:
        bq, bk = block_size
        b = torch.as_tensor(blocks, dtype=torch.bool, device=q.device)
        b = b.repeat_interleave(bq, 1).repeat_interleave(bk, 2)[:, :Sq, :Sk]
        ok = ok & b
    if mask is not None:
        ok = ok & mask[:, None].to(device=q.device, dtype=torch.bool)
    s = s.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        sink = sinks.to(s.dtype).reshape(1, Hq, 1, 1).expand(B, Hq, Sq, 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    if keep is not None:
        p = p * keep / (1 - dropout_p)
    out = (p.to(dtype) @ vd).transpose(1, 2)
    return out, lse


def distances(sq, sk, align="bottom-right", device="cuda"):
    """|i + off − j|, (Sq, Sk): ALiBi's distance of key j from query i's
    diagonal."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = sk - sq if align == "bottom-right" else 0
    return (i + off - j).abs()


def alibi_slopes(heads, batch=None, device="cuda"):
    """ALiBi's geometric slopes 2^(−8(h+1)/H), times (1 + b/4) in batch b when
    batch is given ((B, H)), else (H,); fp32."""
    h = torch.arange(1, heads + 1, dtype=torch.float64)
    slopes = torch.pow(2.0, -8.0 * h / heads)
    if batch is not None:
        slopes = slopes[None, :] * (1 + torch.arange(batch, dtype=torch.float64)[:, None] / 4)
    return slopes.float().to(device)


def error(a, ref):
    return (a.double() - ref.double()).abs().max().item()


def indices(B, H, Sq, Sk, device="cuda"):
    """b, h, q, k as broadcasting index tensors: (B,1,1,1) ... (1,1,1,Sk)."""
    return (torch.arange(B, device=device).view(B, 1, 1, 1),
            torch.arange(H, device=device).view(1, H, 1, 1),
            torch.arange(Sq, device=device).view(1, 1, Sq, 1),
            torch.arange(Sk, device=device).view(1, 1, 1, Sk))


def modified_attention(q, k, v, score_fn=None, mask_fn=None, scale=None, dtype=torch.float64,
                       causal=False):
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq)) with the modifiers applied to
    whole score matrices: score_fn(s, b, h, q, k) and mask_fn(b, h, q, k) on
    broadcasting index tensors (FlexAttention's functions work as they
    are). In a low precision dtype the scores are fp32, as a framework
    computes them. causal: top-left (key j visible to query i iff j <= i)."""
    B, Sq, Hq, D = q.shape
    Sk = k.shape[1]
    vd, s = scores(q, k, v, scale, dtype)
    b, h, i, j = indices(B, Hq, Sq, Sk, q.device)
    if score_fn is not None:
        s = score_fn(s, b, h, i, j)
        if dtype == torch.float64:
            s = s.double()
    ok = torch.ones(B, Hq, Sq, Sk, dtype=torch.bool, device=q.device)
    if mask_fn is not None:
        ok = ok & mask_fn(b, h, i, j)
    if causal:
        ok = ok & (j <= i)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p.to(dtype) @ vd).transpose(1, 2), lse

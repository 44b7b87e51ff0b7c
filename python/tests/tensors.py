"""Inputs the GPU tests share: random q, k, v and paged KV caches."""
import torch


def inputs(B, Sq, Sk, Hq, Hk, D, dtype, scale=1.0, grad=True, seed=0, Dv=None):
    """q (B, Sq, Hq, D), k (B, Sk, Hk, D) and v (B, Sk, Hk, Dv) (Dv None:
    D), scaled normal values."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda S, H, width: (torch.randn(B, S, H, width, device="cuda", generator=g) *
                                scale).to(dtype)
    q, k, v = make(Sq, Hq, D), make(Sk, Hk, D), make(Sk, Hk, D if Dv is None else Dv)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def make_cache(k_full, v_full, lengths, new, page_size, g):
    """k_full (B, S, H, D), v_full (B, S, H, Dv) -> pools of pages
    (num_pages, page_size, H, D) and (..., Dv) holding each sequence's first
    lengths[b] rows in shuffled pages, room for `new` more, NaN elsewhere,
    and the block table."""
    B, S, H, _ = k_full.shape
    need = [-(-(n + new) // page_size) for n in lengths]
    pages = sum(need) + 2
    order = torch.randperm(pages, generator=g).tolist()
    pools = [torch.full((pages, page_size, H, full.shape[3]), float("nan"), dtype=full.dtype,
                        device=full.device) for full in (k_full, v_full)]
    table = torch.full((B, -(-S // page_size)), pages + 100, dtype=torch.int32)  # outside the pool
    for b, n in enumerate(lengths):
        for i in range(need[b]):
            table[b, i] = page = order.pop()
            for pool, full in zip(pools, (k_full, v_full)):
                rows = full[b, i * page_size:min(n, (i + 1) * page_size)]
                pool[page, :rows.shape[0]] = rows
    return pools[0], pools[1], table.cuda()

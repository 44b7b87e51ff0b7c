"""flashgen.distributed.context_parallel_attention on GPUs, one process per
GPU over NCCL: the whole sequence's output and gradients, gathered from the
ranks' shards, against the single-GPU call on the whole sequence.

Without dropout both are measured against fp32 attention (relative L2
error) and the sharded call's error may be at most twice the single call's.
With dropout the keep decisions cannot be redrawn outside the kernels: the
sharded result must lie within four units of the dtype's precision of the
single call with the same seed, and ten times closer to it than the single
call with another seed is (so the decisions are the same). The scores'
variants, expressions and a value head dim unlike the query's are held to
four units of the single call. The deterministic flag gives
bitwise-identical gradients run to run. Runs with
every GPU there is (at least 2); one test runs a group of one rank on one
GPU."""
import os
import socket

import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import flashgen  # noqa: E402
from flashgen import distributed as cp  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, name, args):
    torch.cuda.set_device(rank)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        globals()[name](rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(name, world, *args):
    mp.spawn(_worker, args=(world, _free_port(), name, args), nprocs=world, join=True)


def gpus_or_skip():
    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip(f"context parallelism needs at least 2 GPUs; {count} found")
    return min(count, 8)


# ---- references --------------------------------------------------------------------

def reference32(q, k, v, d_out, causal, window, block=1024):
    """fp32 attention over the whole sequence (equal lengths) and its
    gradients, a block of queries at a time: (out, dq, dk, dv)."""
    B, S, Hq, D = q.shape
    g = Hq // k.shape[2]
    kf = k.float().requires_grad_()
    vf = v.float().requires_grad_()
    outs, dqs = [], []
    j = torch.arange(S, device=q.device)[None, :]
    for i0 in range(0, S, block):
        qb = q[:, i0:i0 + block].float().requires_grad_()
        i = torch.arange(i0, i0 + qb.shape[1], device=q.device)[:, None]
        ok = torch.ones(qb.shape[1], S, dtype=torch.bool, device=q.device)
        if causal:
            ok &= j <= i
        if window is not None:
            if window[0] >= 0:
                ok &= j >= i - window[0]
            if window[1] >= 0:
                ok &= j <= i + window[1]
        s = torch.einsum("bihd,bjhd->bhij", qb, kf.repeat_interleave(g, 2)) * D ** -0.5
        p = torch.softmax(s.masked_fill(~ok, float("-inf")), -1)
        out = torch.einsum("bhij,bjhd->bihd", p, vf.repeat_interleave(g, 2))
        (out * d_out[:, i0:i0 + block].float()).sum().backward()
        outs.append(out.detach())
        dqs.append(qb.grad)
    return torch.cat(outs, 1), torch.cat(dqs, 1), kf.grad, vf.grad


def rel(a, ref):
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


def sharded_call(rank, world, q, k, v, d_out, balanced, cu=None, **opts):
    """The sharded call's whole output and gradients, gathered on every rank."""
    if cu is None:
        local = [cp.shard(t, rank, world, balanced=balanced) for t in (q, k, v, d_out)]
    else:
        local = [cp.shard_varlen(t, cu, rank, world, balanced=balanced) for t in (q, k, v, d_out)]
    ql, kl, vl = (t.detach().requires_grad_() for t in local[:3])
    out = cp.context_parallel_attention(ql, kl, vl, balanced=balanced, cu_seqlens=cu, **opts)
    out.backward(local[3])
    whole = []
    for t in (out.detach(), ql.grad, kl.grad, vl.grad):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        whole.append(cp.unshard(parts, balanced=balanced) if cu is None else
                     cp.unshard_varlen(parts, cu, balanced=balanced))
    return whole


def single_call(q, k, v, d_out, **opts):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flashgen.attention(*leaves, **opts)
    out.backward(d_out)
    return [out.detach()] + [t.grad for t in leaves]


NAMES = ("out", "dq", "dk", "dv")

# S, B, Hq, Hkv, D, dtype, causal, align, window, dropout_p, balanced
CASES = [
    (32768, 1, 4, 2, 128, torch.bfloat16, True, "bottom-right", None, 0.0, True),
    (32768, 2, 2, 2, 64, torch.float16, False, "bottom-right", None, 0.0, True),
    (32768, 1, 2, 1, 128, torch.bfloat16, True, "top-left", None, 0.0, False),
    (32768, 1, 2, 2, 96, torch.bfloat16, False, "bottom-right", (2000, 300), 0.0, True),
    (131072, 1, 2, 2, 64, torch.bfloat16, True, "top-left", None, 0.0, True),
    (65536, 1, 4, 1, 128, torch.bfloat16, True, "bottom-right", None, 0.1, True),
    (32768, 1, 2, 2, 64, torch.float16, False, "bottom-right", (4096, 4096), 0.15, False),
    # chunks of 8191 tokens (two ranks): diagonals off every tile
    (32764, 1, 6, 2, 72, torch.bfloat16, True, "bottom-right", (3001, 0), 0.0, True),
    (32764, 1, 3, 3, 40, torch.float16, False, "top-left", (777, 1234), 0.0, False),
]


def _dense_cases(rank, world, cases):
    for n, (S, B, Hq, Hk, D, dtype, causal, align, window, p, balanced) in enumerate(cases):
        if S % ((2 if balanced else 1) * world):
            print(f"case {n}: {S} tokens do not divide among {world} ranks; not run")
            continue
        g = torch.Generator(device="cuda").manual_seed(100 + n)
        q, d_out = (torch.randn(B, S, Hq, D, device="cuda", generator=g).to(dtype)
                    for _ in range(2))
        k, v = (torch.randn(B, S, Hk, D, device="cuda", generator=g).to(dtype) for _ in range(2))
        opts = dict(causal=causal, align=align, window=window, dropout_p=p)
        torch.manual_seed(7)  # the same dropout stream on every rank and in the single call
        got = sharded_call(rank, world, q, k, v, d_out, balanced, **opts)
        if rank != 0:
            continue
        torch.manual_seed(7)
        single = single_call(q, k, v, d_out, **opts)
        label = f"case {n} (S {S}, {'causal' if causal else 'full'}, window {window}, p {p})"
        if p == 0:
            ref = reference32(q, k, v, d_out, causal, window)
            for name, x, y, r in zip(NAMES, got, single, ref):
                e, bound = rel(x, r), 2 * rel(y, r)
                print(f"{label} {name}: sharded {e:.2e}, single {bound / 2:.2e}")
                assert e <= bound, f"{label}: {name} error {e:.3e} > 2 x single's {bound / 2:.3e}"
        else:
            torch.manual_seed(8)
            other = single_call(q, k, v, d_out, **opts)
            unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
            for name, x, y, z in zip(NAMES, got, single, other):
                same, apart = rel(x, y), rel(z, y)
                print(f"{label} {name}: from single {same:.2e}, another seed {apart:.2e}")
                assert same <= 4 * unit, f"{label}: {name} {same:.3e} from the single call"
                assert apart >= 10 * same, f"{label}: {name} keeps differ ({same:.3e}, {apart:.3e})"


def _packed_cases(rank, world):
    n = 2 * world
    lengths = [4096 * n // 4, 0, 12288 * n // 4, n, 16384 * n // 4]
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    g = torch.Generator(device="cuda").manual_seed(5)
    T, Hq, Hk, D = cu[-1], 4, 2, 128
    q, d_out = (torch.randn(T, Hq, D, device="cuda", generator=g).to(torch.bfloat16)
                for _ in range(2))
    k, v = (torch.randn(T, Hk, D, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))
    for causal in (True, False):
        got = sharded_call(rank, world, q, k, v, d_out, True, cu=cu, causal=causal)
        if rank != 0:
            continue
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
        out = flashgen.attention_varlen(*leaves, cu_t, cu_t, max(lengths), max(lengths),
                                        causal=causal)
        out.backward(d_out)
        single = [out.detach()] + [t.grad for t in leaves]
        for b in range(len(lengths)):
            rows = slice(cu[b], cu[b + 1])
            if cu[b] == cu[b + 1]:
                continue
            ref = reference32(*(t[None, rows] for t in (q, k, v, d_out)), causal, None)
            for name, x, y, r in zip(NAMES, got, single, ref):
                e, bound = rel(x[rows], r[0]), 2 * rel(y[rows], r[0])
                assert e <= bound, f"sequence {b} causal {causal}: {name} {e:.3e} > {bound:.3e}"


def _variant_cases(rank, world):
    """The scores' variants on the whole sequence (ALiBi at the global
    distances, each row's sink counted once), against the single call with
    the same variants: within four units of the dtype's precision, the
    sinks' gradient summed over the ranks."""
    S, Hq, Hk, D = 1024 * world, 4, 2, 128
    g = torch.Generator(device="cuda").manual_seed(21)
    q, d_out = (torch.randn(1, S, Hq, D, device="cuda", generator=g).to(torch.bfloat16)
                for _ in range(2))
    k, v = (torch.randn(1, S, Hk, D, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))
    slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(Hq)], device="cuda")
    sink_values = [0.5 + h for h in range(Hq)]
    cases = [dict(causal=True, softcap=2.0), dict(causal=True, alibi_slopes=slopes),
             dict(causal=False, window=(300, 40), alibi_slopes=slopes, softcap=1.5),
             dict(causal=False, sinks=True), dict(causal=True, softcap=3.0, alibi_slopes=slopes,
                                                  sinks=True)]
    unit = 2.0 ** -8
    for n, opts in enumerate(cases):
        sinks = [torch.tensor(sink_values, device="cuda", requires_grad=True) for _ in range(2)]
        mine, theirs = dict(opts), dict(opts)
        if opts.get("sinks"):
            mine["sinks"], theirs["sinks"] = sinks
        got = sharded_call(rank, world, q, k, v, d_out, True, **mine)
        if opts.get("sinks"):
            dist.all_reduce(sinks[0].grad)
        if rank != 0:
            continue
        single = single_call(q, k, v, d_out, **theirs)
        for name, x, y in zip(NAMES, got, single):
            same = rel(x, y)
            print(f"variants {n} {name}: from the single call {same:.2e}")
            assert same <= 4 * unit, f"variants {n} ({opts}): {name} {same:.3e} from the single call"
        if opts.get("sinks"):
            same = rel(sinks[0].grad, sinks[1].grad)
            print(f"variants {n} d_sinks: from the single call {same:.2e}")
            assert same <= 4 * unit, f"variants {n}: d_sinks {same:.3e} from the single call"


def _expression_cases(rank, world):
    """Score and mask expressions on the whole sequence (q and k the global
    positions, the aux tensors the whole sequence's on every rank), against
    the single call with the same expressions: within four units of the
    dtype's precision, the bias's and the sinks' gradients summed over the
    ranks. A relative bias and documents, as strings and as functions,
    causal or not: a document of exactly the first chunk hides whole pairs
    of chunks, and with padding (-1) rows see no key at all."""
    S, Hq, Hk, D = 1024 * world, 4, 2, 128
    C = S - 1
    g = torch.Generator(device="cuda").manual_seed(22)
    q, d_out = (torch.randn(1, S, Hq, D, device="cuda", generator=g).to(torch.bfloat16)
                for _ in range(2))
    k, v = (torch.randn(1, S, Hk, D, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))
    bias_values = torch.randn(Hq, 2 * S - 1, device="cuda", generator=g)
    sink_values = [0.5 + h for h in range(Hq)]
    chunk = S // (2 * world)
    pos = torch.arange(S, device="cuda")
    doc = sum((pos >= b).int() for b in (chunk, chunk + chunk // 3, 3 * S // 4 + 5))
    padded = doc.clone()
    padded[-40:] = -1

    def rel_bias(bias):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[h, q_idx - kv_idx + C]
        return score_mod

    def documents(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def padded_documents(b, h, q_idx, kv_idx):
        return (padded[q_idx] == padded[kv_idx]) & (padded[q_idx] >= 0)

    text = f"s + bias[h, q - k + {C}]"
    cases = [  # (options, the modifiers for a bias tensor)
        (dict(causal=True), lambda bias: dict(score_mod=text, aux={"bias": bias})),
        (dict(causal=False), lambda bias: dict(score_mod=rel_bias(bias))),
        (dict(causal=True), lambda bias: dict(mask_mod="doc[q] == doc[k]", aux={"doc": doc})),
        (dict(causal=False), lambda bias: dict(mask_mod=documents)),
        (dict(causal=True), lambda bias: dict(score_mod=text,
                                              mask_mod="doc[q] == doc[k] && doc[q] >= 0",
                                              aux={"bias": bias, "doc": padded})),
        (dict(causal=False, window=(300, 40), sinks=True),
         lambda bias: dict(score_mod=rel_bias(bias), mask_mod=padded_documents)),
    ]
    unit = 2.0 ** -8
    for n, (opts, modifiers) in enumerate(cases):
        biases = [bias_values.clone().requires_grad_() for _ in range(2)]
        sinks = [torch.tensor(sink_values, device="cuda", requires_grad=True) for _ in range(2)]
        mine, theirs = dict(opts, **modifiers(biases[0])), dict(opts, **modifiers(biases[1]))
        if opts.get("sinks"):
            mine["sinks"], theirs["sinks"] = sinks
        got = sharded_call(rank, world, q, k, v, d_out, True, **mine)
        # every score_mod here reads the bias; the same collectives on every rank
        reads_bias = mine.get("score_mod") is not None
        if reads_bias:
            assert biases[0].grad is not None, f"expressions {n}: the bias got no gradient"
            dist.all_reduce(biases[0].grad)
        if opts.get("sinks"):
            dist.all_reduce(sinks[0].grad)
        if rank != 0:
            continue
        single = single_call(q, k, v, d_out, **theirs)
        label = f"expressions {n} ({opts})"
        pairs = list(zip(NAMES, got, single))
        if reads_bias:
            pairs.append(("d_bias", biases[0].grad, biases[1].grad))
        if opts.get("sinks"):
            pairs.append(("d_sinks", sinks[0].grad, sinks[1].grad))
        for name, x, y in pairs:
            same = rel(x, y)
            print(f"{label} {name}: from the single call {same:.2e}")
            assert same <= 4 * unit, f"{label}: {name} {same:.3e} from the single call"


def _value_head_dim_cases(rank, world):
    """A value head dim of its own (DeepSeek's 192/128 on dense shards, causal
    or not with GQA; 128/64 on packed ones): the ring carries K and V of
    their own widths and merges outputs of V's; against the single call,
    within four units of the dtype's precision."""
    unit = 2.0 ** -8
    S, Hq, Hk = 1024 * world, 4, 2
    g = torch.Generator(device="cuda").manual_seed(23)
    q, k = (torch.randn(1, S, h, 192, device="cuda", generator=g).to(torch.bfloat16)
            for h in (Hq, Hk))
    v = torch.randn(1, S, Hk, 128, device="cuda", generator=g).to(torch.bfloat16)
    d_out = torch.randn(1, S, Hq, 128, device="cuda", generator=g).to(torch.bfloat16)
    for causal in (True, False):
        got = sharded_call(rank, world, q, k, v, d_out, True, causal=causal)
        if rank != 0:
            continue
        assert got[0].shape == (1, S, Hq, 128) and got[3].shape == v.shape
        for name, x, y in zip(NAMES, got, single_call(q, k, v, d_out, causal=causal)):
            same = rel(x, y)
            print(f"value head dim, causal {causal}, {name}: from the single call {same:.2e}")
            assert same <= 4 * unit, f"causal {causal}: {name} {same:.3e} from the single call"
    n = 2 * world
    lengths = [96 * n, 0, 40 * n, n, 256 * n]
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    T = cu[-1]
    q, k = (torch.randn(T, h, 128, device="cuda", generator=g).to(torch.bfloat16)
            for h in (Hq, Hk))
    v = torch.randn(T, Hk, 64, device="cuda", generator=g).to(torch.bfloat16)
    d_out = torch.randn(T, Hq, 64, device="cuda", generator=g).to(torch.bfloat16)
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
    for causal in (True, False):
        got = sharded_call(rank, world, q, k, v, d_out, True, cu=cu, causal=causal)
        if rank != 0:
            continue
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flashgen.attention_varlen(*leaves, cu_t, cu_t, max(lengths), max(lengths),
                                        causal=causal)
        out.backward(d_out)
        for name, x, y in zip(NAMES, got, [out.detach()] + [t.grad for t in leaves]):
            same = rel(x, y)
            print(f"value head dim, packed, causal {causal}, {name}: {same:.2e}")
            assert same <= 4 * unit, f"packed, causal {causal}: {name} {same:.3e}"


def _deterministic(rank, world):
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, d_out = (torch.randn(1, 32768, 4, 64, device="cuda", generator=g)
                      .to(torch.bfloat16) for _ in range(4))
    runs = []
    for _ in range(2):
        torch.manual_seed(11)
        runs.append(sharded_call(rank, world, q, k, v, d_out, True, causal=True, dropout_p=0.1,
                                 deterministic=True))
    for name, a, b in zip(NAMES, *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


def _bad_input(rank, world):
    q = torch.randn(1, 64 * (rank + 1), 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="differ from rank 0's"):
        cp.context_parallel_attention(q, q, q)
    q = torch.randn(1, 96, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 32"):
        cp.context_parallel_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="this rank's CUDA device"):
        cp.context_parallel_attention(*(q.to(f"cuda:{(rank + 1) % world}"),) * 3)
    with pytest.raises(ValueError, match="packed sequences"):
        cp.context_parallel_attention(q[0], q[0], q[0], cu_seqlens=[0, 96 * world],
                                      window=(4, 4))
    with pytest.raises(ValueError, match="no ALiBi"):
        cp.context_parallel_attention(q[0], q[0], q[0], cu_seqlens=[0, 96 * world],
                                      alibi_slopes=torch.ones(2, device=q.device))
    with pytest.raises(ValueError, match="no expressions"):
        cp.context_parallel_attention(q[0], q[0], q[0], cu_seqlens=[0, 96 * world],
                                      mask_mod="q >= k")
    with pytest.raises(ValueError, match="reads seqlen_q or seqlen_k"):
        cp.context_parallel_attention(q, q, q, mask_mod="k < seqlen_k - 8")
    gloo = dist.new_group(backend="gloo")
    with pytest.raises(ValueError, match="needs NCCL"):
        cp.context_parallel_attention(q, q, q, gloo)


def test_sharded_equals_single_gpu():
    spawn("_dense_cases", gpus_or_skip(), CASES)


def test_packed_sequences():
    spawn("_packed_cases", gpus_or_skip())


def test_variants():
    spawn("_variant_cases", gpus_or_skip())


def test_variants_one_rank():
    spawn("_variant_cases", 1)


def test_expressions():
    spawn("_expression_cases", gpus_or_skip())


def test_expressions_one_rank():
    spawn("_expression_cases", 1)


def test_value_head_dim():
    spawn("_value_head_dim_cases", gpus_or_skip())


def test_value_head_dim_one_rank():
    spawn("_value_head_dim_cases", 1)


def test_deterministic_gradients_bitwise():
    spawn("_deterministic", gpus_or_skip())


def test_bad_input():
    spawn("_bad_input", gpus_or_skip())


def test_one_rank_is_the_single_call():
    spawn("_dense_cases", 1, [CASES[0], CASES[3], CASES[5]])

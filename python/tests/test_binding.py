"""The ctypes binding over an offline context: struct layouts against C's,
plan, source and compile for named targets, and errors."""
import ctypes
import os
import shutil
import subprocess
import sys

import pytest

import flashgen
from flashgen import _native

from conftest import REPO

HEADER = os.path.join(REPO, "include", "flashgen.h")

STRUCTS = {"fg_spec": _native.Spec, "fg_tensor": _native.Tensor,
           "fg_aux_decl": _native.AuxDecl, "fg_aux_tensor": _native.AuxTensor,
           "fg_forward_args": _native.ForwardArgs, "fg_backward_args": _native.BackwardArgs,
           "fg_plan_info": _native.PlanInfo, "fg_kernel_info": _native.KernelInfo,
           "fg_tune_report": _native.TuneReport}


@pytest.mark.skipif(not (os.path.exists(HEADER) and shutil.which("cc")),
                    reason="needs the source tree's header and a C compiler")
def test_struct_layouts_match_the_header(tmp_path):
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "flashgen.h"',
             'int main(void) {']
    for cname, cls in STRUCTS.items():
        lines.append(f'printf("{cname} sizeof() %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)], check=True)
    seen = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        cname, field, value = line.split()
        seen[(cname, field)] = int(value)
    for cname, cls in STRUCTS.items():
        assert ctypes.sizeof(cls) == seen[(cname, "sizeof()")], cname
        for field, _ in cls._fields_:
            assert getattr(cls, field).offset == seen[(cname, field)], f"{cname}.{field}"
    # the expressions' arrays: FG_MAX_AUX entries each
    assert seen[("fg_spec", "sizeof()")] - seen[("fg_spec", "aux")] == \
        _native.MAX_AUX * ctypes.sizeof(_native.AuxDecl)
    assert seen[("fg_forward_args", "sizeof()")] - seen[("fg_forward_args", "aux")] == \
        _native.MAX_AUX * ctypes.sizeof(_native.AuxTensor)
    assert seen[("fg_backward_args", "sizeof()")] - seen[("fg_backward_args", "d_aux")] == \
        _native.MAX_AUX * ctypes.sizeof(ctypes.c_void_p)


@pytest.mark.skipif(not (os.path.exists(HEADER) and shutil.which("cc")),
                    reason="needs the source tree's header and a C compiler")
def test_max_aux_is_the_headers():
    text = open(HEADER).read()
    assert f"#define FG_MAX_AUX {_native.MAX_AUX}" in text
    assert "FG_AUX_F32 = 0, FG_AUX_I32 = 1" in text
    assert _native.AUX_TYPES == {"float32": 0, "int32": 1}


def test_expression_specs_reach_the_library():
    spec = flashgen.make_spec(64, "bf16", score_mod="s + bias[h, q - k]",
                              mask_mod="doc[q] == doc[k]",
                              aux=[("bias", "float32", 2), ("doc", "int32", 1)])
    assert spec.score_mod == b"s + bias[h, q - k]" and spec.mask_mod == b"doc[q] == doc[k]"
    assert spec.aux_count == 2
    assert (spec.aux[0].name, spec.aux[0].type, spec.aux[0].rank) == (b"bias", 0, 2)
    assert (spec.aux[1].name, spec.aux[1].type, spec.aux[1].rank) == (b"doc", 1, 1)
    plain = flashgen.make_spec(64, "bf16")
    assert plain.score_mod is None and plain.mask_mod is None and plain.aux_count == 0
    ctx = flashgen.Context("h100")
    for pass_ in ("forward", "backward"):
        name = ctx.plan(spec, pass_)["kernel_name"]
        assert "_sm" in name, name  # both expressions' digest
    with pytest.raises(ValueError, match="aux 'x' type"):
        flashgen.make_spec(64, aux=[("x", "float16", 1)])
    with pytest.raises(flashgen.InvalidArgument, match="score_mod: a score modifier replaces "
                                                       "softcap"):
        ctx.plan(flashgen.make_spec(64, "bf16", softcap=True, score_mod="s * 2.0"), "forward")


def test_value_head_dim_reaches_the_library():
    """make_spec(head_dim_v=...): the field sits where the header has it
    (the kernels' names carry it); on the Hopper target the Hopper families
    take such specs, and the decode family decoding steps'; dims past 256
    and a decoding step's value head dim off multiples of 8 are refused by
    the library with its message."""
    assert flashgen.make_spec(192, "bf16").head_dim_v == 0
    for target, arch in (("h100", 90), ("a100", 80), ("t4", 75)):
        ctx = flashgen.Context(target)
        for d, dv in ((192, 128), (128, 64), (64, 128), (96, 64), (256, 128)):
            spec = flashgen.make_spec(d, "fp16", "causal", head_dim_v=dv)
            for pass_, family in (("forward", "fwd"), ("backward", "bwd")):
                sm = f"{arch}a" if arch == 90 else arch
                name = ctx.plan(spec, pass_)["kernel_name"]
                assert name.startswith(f"fg_{family}_sm{sm}_fp16_d{d}v{dv}_causal_"), name
        same = ctx.plan(flashgen.make_spec(128, "fp16", head_dim_v=128))["kernel_name"]
        assert same == ctx.plan(flashgen.make_spec(128, "fp16"))["kernel_name"]
    name = ctx.plan(flashgen.make_spec(64, kv_cache=True, head_dim_v=128))["kernel_name"]
    assert name.startswith(f"fg_decode_sm{arch}_fp16_d64v128_kvcache_"), name
    with pytest.raises(flashgen.InvalidArgument, match="spec.kv_cache: value head dim 36; a "
                                                       "decoding step needs a multiple of 8"):
        ctx.plan(flashgen.make_spec(64, kv_cache=True, head_dim_v=36))
    with pytest.raises(flashgen.InvalidArgument, match="spec.head_dim_v: 300 is outside 1..256"):
        ctx.plan(flashgen.make_spec(64, head_dim_v=300))


def test_block_mask_pass_plans_the_build_from_the_predicate_alone():
    ctx = flashgen.Context("h100")
    names = [ctx.plan(flashgen.make_spec(d, dtype, mask="causal", sparsity="layout",
                                         sparse_block=(128, 128), mask_mod="doc[q] == doc[k]",
                                         aux=[("doc", "int32", 1)]), "block_mask")["kernel_name"]
             for d, dtype in ((64, "fp16"), (128, "bf16"))]
    assert names[0] == names[1] and names[0].startswith("fg_blockmask_sm90_"), names
    with pytest.raises(flashgen.InvalidArgument, match="a block mask needs spec.mask_mod"):
        ctx.plan(flashgen.make_spec(64, mask_mod="k > 0"), "block_mask")
    with pytest.raises(ValueError, match="valid: forward, backward, block_mask"):
        ctx.plan(flashgen.make_spec(64), "sideways")


def test_version_is_the_headers():
    if not os.path.exists(HEADER):
        pytest.skip("needs the source tree's header")
    text = open(HEADER).read()
    assert f'#define FLASHGEN_VERSION "{flashgen.__version__}"' in text


def test_offline_plan_source_and_compile():
    ctx = flashgen.Context("h100")
    assert "sm_90" in ctx.target and ctx.arch == 90
    spec = flashgen.make_spec(72, "bf16", "causal", dropout=True)
    plan = ctx.plan(spec, "forward")
    assert plan["block_m"] >= 16 and plan["block_n"] >= 16 and plan["threads"] % 32 == 0
    assert plan["head_dim_padded"] == 72 or plan["head_dim_padded"] % 16 == 0
    assert plan["kernel_name"].startswith("fg_fwd_sm90a_bf16_d72")  # the Hopper family
    source = ctx.source(spec, "forward")
    assert "__global__" in source and plan["kernel_name"] in source
    back = ctx.plan(spec, "backward")
    assert back["kernel_name"].startswith("fg_bwd_sm90a_bf16_d72")  # dropout too
    info = ctx.compile(spec, "forward")
    assert info["registers"] > 0 and info["from_cache"] in ("compiled", "disk", "memory")
    again = ctx.compile(spec, "forward")
    assert again["from_cache"] == "memory"


def test_variant_specs_reach_the_library():
    """The spec's softcap, alibi and sinks fields, as C reads them: they name
    the kernel."""
    ctx = flashgen.Context("a100")
    plain = ctx.plan(flashgen.make_spec(64, "bf16", "causal"), "forward")["kernel_name"]
    assert "_cap" not in plain and "_alibi" not in plain and "_sink" not in plain
    for kw, part in ((dict(softcap=True), "_cap"), (dict(alibi=True), "_alibi"),
                     (dict(sinks=True), "_sink")):
        for pass_ in ("forward", "backward"):
            name = ctx.plan(flashgen.make_spec(64, "bf16", "causal", **kw), pass_)["kernel_name"]
            assert part in name, (kw, pass_, name)
    both = flashgen.make_spec(64, "fp16", softcap=True, alibi=True, sinks=True, kv_cache=True)
    assert (both.softcap, both.alibi, both.sinks, both.kv_cache) == (1, 1, 1, 1)
    name = ctx.plan(both, "forward")["kernel_name"]
    assert "_cap" in name and "_alibi" in name and "_sink" in name


def test_offline_compile_log_reaches_logging(caplog):
    ctx = flashgen.Context("a100")
    with caplog.at_level("INFO", logger="flashgen"):
        ctx.compile(flashgen.make_spec(40, "fp16"), "forward")
    assert any("compiled fg_fwd_sm80_fp16_d40" in r.getMessage() for r in caplog.records)
    # the logger's name says flashgen; the message does not repeat it
    assert not any(r.getMessage().startswith("flashgen: ") for r in caplog.records)


def test_errors_name_the_argument():
    with pytest.raises(flashgen.InvalidArgument, match="v100.*t4, a100"):
        flashgen.Context("v100")
    with pytest.raises(flashgen.InvalidArgument, match="cuda:N"):
        flashgen.Context("cuda:x")
    ctx = flashgen.Context("t4")
    with pytest.raises(flashgen.InvalidArgument, match="head_dim"):
        ctx.plan(flashgen.make_spec(300), "forward")
    with pytest.raises(flashgen.Unsupported, match="bf16"):
        ctx.plan(flashgen.make_spec(64, "bf16"), "forward")
    with pytest.raises(ValueError, match="fp16, bf16"):
        flashgen.make_spec(64, "fp32")
    with pytest.raises(ValueError, match="pass"):
        ctx.plan(flashgen.make_spec(64), "sideways")
    with pytest.raises(flashgen.InvalidArgument, match="batch: 0"):
        ctx.forward(flashgen.make_spec(64), _native.ForwardArgs())
    t = _native.Tensor(0x10000, 64 * 64, 64, 64 * 64, 1)  # (1, 64, 1, 64), never touched
    args = _native.ForwardArgs(t, t, t, t, None, 1, 1, 1, 64, 64, 0.0, 0, -1, -1)
    with pytest.raises(flashgen.NoDevice, match="offline"):
        ctx.forward(flashgen.make_spec(64), args)


def test_add_bundle_refuses_a_folder_without_manifest(tmp_path):
    with pytest.raises(ValueError, match="not a bundle"):
        flashgen.add_bundle(tmp_path)


def test_pip_nvrtc_folders_are_found(tmp_path, monkeypatch):
    cu13 = tmp_path / "nvidia" / "cu13" / "lib"
    cu12 = tmp_path / "nvidia" / "cuda_nvrtc" / "lib"
    for d, name in ((cu13, "libnvrtc.so.13"), (cu12, "libnvrtc.so.12")):
        d.mkdir(parents=True)
        (d / name).write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    assert _native.nvrtc_dirs()[:2] == [str(cu13), str(cu12)]


def test_import_sets_the_nvrtc_path_for_the_library(tmp_path):
    d = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    d.mkdir(parents=True)
    (d / "libnvrtc.so.13").write_bytes(b"")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "site")] + [p for p in sys.path if p]), FLASHGEN_NVRTC_PATH="/opt/mine")
    out = subprocess.run([sys.executable, "-c",
                          "import os, flashgen; print(os.environ['FLASHGEN_NVRTC_PATH'])"],
                         env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert out.split(":")[:2] == ["/opt/mine", str(d)]


def test_packed_arguments_equal_field_by_field_ones():
    q, k, v, o = [(0x1000 * (i + 1), 11 + i, 22 + i, 33 + i) for i in range(4)]
    fields = (0x9000, 2, 8, 2, 77, 131, 0.125, 1, 17, -1, 0.25, 2 ** 64 - 5, 2 ** 40 + 4, 0x7000,
              0x6000)
    packed = _native.forward_args(q, k, v, o, *fields)
    T = lambda t: _native.Tensor(*t, 1)
    ref = _native.ForwardArgs(T(q), T(k), T(v), T(o), *fields)
    assert bytes(packed) == bytes(ref)
    grads = [(0x2000 * (i + 1), 5 + i, 6 + i, 7 + i) for i in range(4)]
    back = _native.backward_args(packed, *grads, True, 0x8000, 4096)
    ref_back = _native.BackwardArgs(ref, *map(T, grads), 1, 0x8000, 4096)
    assert bytes(back) == bytes(ref_back)
    variants = (30.0, 0xc000, 8, 0xd000)
    packed = _native.forward_args(q, k, v, o, *fields, positions=(64, 32), variants=variants)
    ref = _native.ForwardArgs(T(q), T(k), T(v), T(o), *fields)
    ref.position_q, ref.position_k = 64, 32
    ref.softcap, ref.alibi_slopes, ref.alibi_stride_batch, ref.sinks = variants
    assert bytes(packed) == bytes(ref)
    back = _native.backward_args(packed, *grads, False, 0x8000, 4096, d_sinks=0xe000)
    ref_back = _native.BackwardArgs(ref, *map(T, grads), 0, 0x8000, 4096, 0xe000)
    assert bytes(back) == bytes(ref_back)
    aux = [(0xf000, (4, 63), (63, 1)), (0xf800, (7,), (0,)), (0xfc00, (2, 3, 5), (15, 5, 1))]
    packed = _native.forward_args(q, k, v, o, *fields, variants=variants, aux=aux)
    ref = _native.ForwardArgs(T(q), T(k), T(v), T(o), *fields)
    ref.softcap, ref.alibi_slopes, ref.alibi_stride_batch, ref.sinks = variants
    for i, (data, size, stride) in enumerate(aux):
        ref.aux[i].data = data
        for d, (n, st) in enumerate(zip(size, stride)):
            ref.aux[i].size[d], ref.aux[i].stride[d] = n, st
    assert bytes(packed) == bytes(ref)
    d_aux = (0x1100, 0, 0x1300)
    back = _native.backward_args(packed, *grads, False, 0x8000, 4096, 0xe000, d_aux)
    ref_back = _native.BackwardArgs(ref, *map(T, grads), 0, 0x8000, 4096, 0xe000)
    for i, p in enumerate(d_aux):
        ref_back.d_aux[i] = p
    assert bytes(back) == bytes(ref_back)
    with pytest.raises(ValueError, match="at most 8"):
        _native.forward_args(q, k, v, o, *fields, aux=aux * 3)
    k_new, v_new = (0xa000, 1, 2, 3), (0xb000, 4, 5, 6)
    cache = (0x3000, 0x4000, 9, 16, 500, k_new, v_new, 2, 7, 0x5000, 1 << 20, 0x6000)
    packed = _native.forward_args(q, k, v, o, *fields, cache=cache)
    ref = _native.ForwardArgs(T(q), T(k), T(v), T(o), *fields, 0, 0, 0, 0, 0, *cache[:5],
                              T(k_new), T(v_new), *cache[7:])
    assert bytes(packed) == bytes(ref)


def test_python_m_flashgen_runs_the_command_line():
    cli = os.environ.get("FLASHGEN_CLI") or os.path.join(
        os.path.dirname(flashgen.__file__), "bin", "flashgen")
    if not os.access(cli, os.X_OK):
        pytest.skip("no command line built or installed")
    run = subprocess.run([sys.executable, "-m", "flashgen", "plan", "-d", "64", "--target", "t4"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "fg_fwd_sm75_fp16_d64" in run.stdout

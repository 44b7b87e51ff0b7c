"""The benchmarks (bench/*.py) where they cannot run: without a GPU, or
without PyTorch, each ends with one line saying what it needs (exit 1), and
bench/sdpa.py without its CSV argument with its usage (exit 2); never a
traceback, never silence. A fake PyTorch stands in, so whether this machine
has PyTorch or a GPU does not matter. The picture's script and its data:
plot_speed.py without matplotlib says so in one line (exit 1), with it draws
the checked-in results; bench/results-h200.csv and results-h100.csv hold
exactly the figures of the runs docs/benchmarks.md shows for them. turns.py
times two flashgen builds in turns (no PyTorch)."""
import csv
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

BENCH = os.path.join(REPO, "bench")
NOT_BENCHMARKS = {"requires.py", "results.py", "plot_speed.py", "turns.py"}  # helpers, the picture, two builds timed
SCRIPTS = sorted(f for f in os.listdir(BENCH) if f.endswith(".py") and f not in NOT_BENCHMARKS)

NO_GPU = '''class cuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0
'''
TWO_GPUS = NO_GPU.replace("return False", "return True").replace("return 0", "return 2")
NO_TORCH = 'raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n'


def run(tmp_path, fake, args, cwd=REPO):
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text(fake)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.join(REPO, "python")]))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)


def one_line(r):
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and r.stdout == "", r.stdout + r.stderr
    return lines[0]


def arguments(script):
    return ["fg.csv"] if script == "sdpa.py" else []


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_a_gpu(tmp_path, script):
    assert script in {"context_parallel.py", "decode.py", "expressions.py", "generate.py", "mla.py",
                      "prefill.py", "python_bench.py", "sdpa.py", "sparse.py", "value_head_dim.py",
                      "variants.py", "varlen.py", "window.py"}, \
        "a new benchmark: check it here"
    r = run(tmp_path, NO_GPU, [os.path.join("bench", script), *arguments(script)])
    assert r.returncode == 1
    assert one_line(r) == f"{script}: needs a CUDA GPU, and PyTorch sees none"


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_pytorch(tmp_path, script):
    r = run(tmp_path, NO_TORCH, [os.path.join("bench", script), *arguments(script)])
    assert r.returncode == 1
    assert one_line(r) == f"{script}: needs PyTorch (pip install torch)"


def test_sdpa_without_its_csv(tmp_path):
    r = run(tmp_path, NO_GPU, [os.path.join("bench", "sdpa.py")])
    assert r.returncode == 2
    assert one_line(r).startswith("usage: python3 bench/sdpa.py FG.csv [OTHER.csv]")


def test_more_gpus_than_there_are(tmp_path):
    """context_parallel.py --gpus 4 on two GPUs, through what it calls."""
    r = run(tmp_path, TWO_GPUS, ["-c", "from requires import torch_and_gpus\n"
                                       "torch_and_gpus(2)\n"
                                       "torch_and_gpus(4)"], cwd=BENCH)
    assert r.returncode == 1
    assert one_line(r) == "-c: needs 4 CUDA GPUs, and PyTorch sees 2"


def test_plot_without_matplotlib(tmp_path):
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'matplotlib\'", name="matplotlib")\n')
    r = run(tmp_path, NO_TORCH, [os.path.join("bench", "plot_speed.py"), "-o",
                                 str(tmp_path / "speed.svg")])
    assert r.returncode == 1
    assert one_line(r) == "plot_speed.py: needs matplotlib (pip install matplotlib)"
    assert not (tmp_path / "speed.svg").exists()


def test_plot_draws_the_results(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "speed.svg"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "plot_speed.py"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    svg = out.read_text()
    for text in ("NVIDIA H200", "recorded 2026-11-28",
                 "CUDA 13.0, driver 580.159.04, PyTorch 2.11.0+cu130", "flashgen 0.1.0",
                 "bench/results-h200.csv", "FlashAttention 4"):
        assert text in svg, text


def _table(text, heading, nth=0):
    """The rows of the nth fenced table after heading in docs/benchmarks.md."""
    end = text.index(heading)
    for _ in range(nth + 1):
        start = text.index("```\n", end) + 4
        end = text.index("```", start) + 3
    return [line.split() for line in text[start:end - 3].splitlines()[1:] if line.strip()]


def _tables_figures(runs):
    """The figures of docs/benchmarks.md's runs, {(pass, impl, d, seqlen,
    causal, dropout): (TFLOP/s, date)}: runs oldest first, each (heading,
    date, the lengths taken, the nth tables of the forward, those of the
    backward), a later run's figure taking the shape's place."""
    text = open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8").read()
    figures = {}

    def add(pass_, impl, d, seq, causal, drop, value, date):
        if value != "n/a":
            figures[(pass_, impl, int(d), int(seq), int(causal == "yes"), float(drop))] = \
                (float(value), date)

    for heading, date, taken, forward_tables, backward_tables in runs:
        for nth in forward_tables:
            for d, seq, causal, drop, fg, _, flash, cudnn, flex, fa4, *_ in _table(text, heading, nth):
                if taken(seq):
                    for impl, value in (("flashgen", fg), ("sdpa-flash", flash),
                                        ("sdpa-cudnn", cudnn), ("flex", flex), ("fa4", fa4)):
                        add("forward", impl, d, seq, causal, drop, value, date)
        for row in (row for nth in backward_tables for row in _table(text, heading, nth)):
            d, seq, causal, drop = row[:4]
            if not taken(seq):
                continue
            fgb, det, flb, cub, fab, _, _, fga, fla, cua, faa = row[4:15]
            for pass_, impl, value in (("backward", "flashgen", fgb),
                                       ("backward", "flashgen-deterministic", det),
                                       ("backward", "sdpa-flash", flb),
                                       ("backward", "sdpa-cudnn", cub),
                                       ("backward", "fa4", fab),
                                       ("forward+backward", "flashgen", fga),
                                       ("forward+backward", "sdpa-flash", fla),
                                       ("forward+backward", "sdpa-cudnn", cua),
                                       ("forward+backward", "fa4", faa)):
                add(pass_, impl, d, seq, causal, drop, value, date)
    return figures


def _assert_file_is(name, figures, gpu):
    """bench/<name> holds exactly figures, each row dated as its run and
    measured on gpu: none made up, none left out."""
    sys.path.insert(0, BENCH)
    try:
        import results
    finally:
        sys.path.remove(BENCH)
    rows = results.read(os.path.join(BENCH, name))
    got = {(r["pass"], r["impl"], r["head_dim"], r["seqlen"], r["causal"], r["dropout"]):
           (r["tflops"], r["recorded"]) for r in rows}
    assert len(got) == len(rows), "a figure twice"
    assert got == figures
    for r in rows:
        assert r["gpu"] == gpu and r["source"], r


def test_results_are_the_tables():
    """bench/results-h200.csv is the H200 run's four tables (docs/benchmarks.md,
    "The whole table in turns on an H200": the forward and the backward at
    d = 64 and 128, then at d = 256), the backward at d = 64 and 128 as the
    latest run timed it ("The backward after its blocks walk tiles", dropout 0.1
    too; it replaced "The backward again on an H200" at every shape), and the
    backward at d = 256 likewise ("The backward at d = 256 on the deterministic
    schedule", its first table), the forward at d = 64 and 128 as the latest
    run timed it ("The forward at d = 64 and 128 after the causal walk's
    lists"), and the backward without dropout at every head dim as the latest
    runs timed it ("The backward's warpgroup index" at d = 128, "d = 64 and 256
    forward+backward beside the peers")."""
    whole = ("## The whole table in turns on an H200", "2026-11-28", lambda s: True, (0, 2), (1, 3))
    walk = ("## The backward after its blocks walk tiles", "2026-11-28", lambda s: True, (), (0,))
    d256 = ("## The backward at d = 256 on the deterministic schedule", "2026-11-29",
            lambda s: True, (), (0,))
    lists = ("## The forward at d = 64 and 128 after the causal walk's lists", "2026-11-30",
             lambda s: True, (0,), ())
    index = ("## The backward's warpgroup index", "2026-12-01", lambda s: True, (), (0,))
    d64_256 = ("## d = 64 and 256 forward+backward beside the peers", "2026-12-01",
               lambda s: True, (), (0,))
    assert len(_tables_figures([whole])) == 168
    figures = _tables_figures([whole, walk, d256, lists, index, d64_256])
    # and the later runs' dropout rows: 12 shapes, 7 figures each (FlashAttention 4 has none)
    assert len(figures) == 168 + 12 * 7
    assert sum(date == "2026-11-29" for _, date in figures.values()) == 4 * 7
    assert sum(date == "2026-11-30" for _, date in figures.values()) == 8 * 5
    assert sum(date == "2026-12-01" for _, date in figures.values()) == 12 * 9
    _assert_file_is("results-h200.csv", figures, "NVIDIA H200")


def test_h100_results_are_the_tables():
    """Every figure of bench/results-h100.csv is in the tables of the run it
    comes from (docs/benchmarks.md: the run "at every length", that of
    2026-11-25 at 2k, the first of 2026-11-27 at 8k, the second at both, and
    the forward's and then the backward's of 2026-11-28 at both, each shape's figures
    from the latest run that measured it), with that run's date, and every
    figure of those tables is in the file."""
    later = ("2048", "8192")  # the lengths the later runs measured again
    runs = (("## Beside FlashAttention 4 at every length", "2026-11-23", lambda s: s not in later,
             (0,), (1,)),
            ("## Beside FlashAttention 4 at 2k and 8k", "2026-11-25", lambda s: s == "2048",
             (0,), (1,)),
            ("## Beside FlashAttention 4 at 8k, and packed sequences", "2026-11-27",
             lambda s: s == "8192", (0,), (1,)),
            ("## Beside FlashAttention 4 after the backward's dQ steps", "2026-11-27",
             lambda s: True, (2,), (0, 1)),
            ("## The forward beside FlashAttention 4 after the warp-uniform index", "2026-11-28",
             lambda s: True, (0,), ()),
            ("## Beside FlashAttention 4 after the dQ staged behind the next Sᵀ", "2026-11-28",
             lambda s: True, (), (0,)))
    _assert_file_is("results-h100.csv", _tables_figures(runs), "NVIDIA H100 80GB HBM3")


def test_fa4_column_where_importable(tmp_path):
    """bench/sdpa.py times FlashAttention 4 where flash_attn.cute.interface
    imports (its output unwrapped where the call returns (out, lse)) and
    leaves the column empty where it does not."""
    pytest.importorskip("torch")
    code = '''
import sys
sys.path.insert(0, {bench!r})
import sdpa
print(sdpa.fa4() is None, sdpa.fa4_tflops(64, 128, 1, 1, False, 0.0))
sys.path.insert(0, {fake!r})
sdpa._fa4.clear()
print(sdpa.fa4().__name__, sdpa._fa4_out(1, 2, 3, True), sdpa.fa4("flash_attn_varlen_func"))
'''
    fake = tmp_path / "fake"
    (fake / "flash_attn" / "cute").mkdir(parents=True)
    (fake / "flash_attn" / "__init__.py").write_text("")
    (fake / "flash_attn" / "cute" / "__init__.py").write_text("")
    (fake / "flash_attn" / "cute" / "interface.py").write_text(
        "def flash_attn_func(q, k, v, causal=False):\n    return (q + k + v, causal), 'lse'\n")
    hidden = tmp_path / "hidden"  # a flash_attn that fails to import, as without its libraries
    (hidden / "flash_attn").mkdir(parents=True)
    (hidden / "flash_attn" / "__init__.py").write_text("raise ImportError('no CuTe DSL libraries')\n")
    r = subprocess.run([sys.executable, "-c", code.format(bench=BENCH, fake=str(fake))],
                       env=dict(os.environ, PYTHONPATH=str(hidden)), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["True None", "flash_attn_func (6, True) None"], r.stdout


def test_peers_timed_in_turns(tmp_path):
    """bench/sdpa.py times every implementation of a shape once a round, in
    turn, for ROUNDS rounds, and takes each one's median (of each figure
    where a timer gives several); a timer that fails once (None), or none
    at all (where flashgen's package does not import), gives None."""
    fake = tmp_path / "torch"
    (fake / "nn" / "attention").mkdir(parents=True)
    (fake / "__init__.py").write_text("from . import nn\n")
    (fake / "nn" / "__init__.py").write_text("from . import attention, functional\n")
    (fake / "nn" / "attention" / "__init__.py").write_text(
        "SDPBackend = None\ndef sdpa_kernel(backend):\n    pass\n")
    (fake / "nn" / "functional.py").write_text("def scaled_dot_product_attention():\n    pass\n")
    code = '''
import sys
sys.path.insert(0, {bench!r})
import sdpa
calls = []
def timer(name, *figures):
    def call():
        calls.append(name)
        return figures[calls.count(name) - 1]
    return call
got = sdpa.in_turns({{"a": timer("a", 3.0, 1.0, 2.0), "b": timer("b", (5, 9), (4, 7), (6, 8)),
                     "c": timer("c", 1.0, None, 2.0), "d": False}})
print(sdpa.ROUNDS, "".join(calls), got)
'''
    r = subprocess.run([sys.executable, "-c", code.format(bench=BENCH)],
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3 abcabcabc {'a': 2.0, 'b': (5, 8), 'c': None, 'd': None}", r.stdout


FAKE_FLASHGEN = """#!{python}
import os, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write("{name} " + os.environ["FLASHGEN_CACHE_DIR"] + "\\n")
assert args[:2] == ["bench", "--csv"] and os.path.isdir(os.environ["FLASHGEN_CACHE_DIR"])
d, seq = args[args.index("-d") + 1], args[args.index("--seqlen") + 1]
print("kind,head_dim,seqlen,batch,heads,causal,dropout,ms,tflops")
for causal in (0, 1):
    print(f"flashgen,{{d}},{{seq}},2,16,{{causal}},0.0,{ms},100.0")
print("compile,fg_x,1.0,1.0,0.001")
"""


def test_turns_alternates_the_builds(tmp_path):
    """bench/turns.py runs A's and B's bench in turns (A B, then B A), each
    with a kernel cache of its own that it removes at the end, and prints
    each shape's times and the ratio of B's median to A's."""
    log = tmp_path / "calls"
    exes = []
    for name, ms in (("A", 2.0), ("B", 1.5)):
        exe = tmp_path / f"flashgen-{name}"
        exe.write_text(FAKE_FLASHGEN.format(python=sys.executable, log=str(log), name=name, ms=ms))
        exe.chmod(0o755)
        exes.append(str(exe))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "turns.py"), *exes, "-d", "64",
                        "--seqlen", "1024", "--rounds", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    calls = [line.split() for line in log.read_text().splitlines()]
    assert [name for name, _ in calls] == ["A", "B", "B", "A"]
    caches = {name: {cache for n, cache in calls if n == name} for name in "AB"}
    assert all(len(c) == 1 for c in caches.values()) and caches["A"] != caches["B"]
    assert not any(os.path.exists(c) for cs in caches.values() for c in cs)
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  64")]
    assert [row[2] for row in rows] == ["no", "yes"]
    assert all(row[4:] == ["2.000", "2.000", "1.500", "1.500", "0.750"] for row in rows), r.stdout

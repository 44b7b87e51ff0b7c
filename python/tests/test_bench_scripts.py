"""The benchmarks (bench/*.py) where they cannot run: without a GPU, or
without PyTorch, each ends with one line saying what it needs (exit 1), and
bench/sdpa.py without its CSV argument with its usage (exit 2); never a
traceback, never silence. A fake PyTorch stands in, so whether this machine
has PyTorch or a GPU does not matter."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

BENCH = os.path.join(REPO, "bench")
SCRIPTS = sorted(f for f in os.listdir(BENCH) if f.endswith(".py") and f != "requires.py")

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
    assert script in {"context_parallel.py", "decode.py", "python_bench.py", "sdpa.py", "sparse.py",
                      "varlen.py"}, "a new benchmark: check it here"
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

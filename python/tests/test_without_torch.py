"""Without PyTorch (or transformers): every part of the package that needs
them says so in one way, naming what to install, whether PyTorch is
installed here or not (a fresh interpreter is made to lack it). And the GPU
tests' modules skip themselves, not fail to be collected, where PyTorch is
installed and no GPU is there."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_without(modules, code):
    """code in a fresh interpreter where importing any of modules fails;
    its stdout, stderr and exit code."""
    blocked = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    r = subprocess.run([sys.executable, "-c", f"import sys\n{blocked}{code}"],
                       capture_output=True, text=True)
    return r.stdout, r.stderr, r.returncode


TORCH = "needs PyTorch (pip install torch)"
BOTH = "needs PyTorch and transformers (pip install torch transformers)"


@pytest.mark.parametrize("code, message", [
    ("import flashgen.distributed", f"flashgen.distributed {TORCH}"),
    ("from flashgen import distributed", f"flashgen.distributed {TORCH}"),
    ("import flashgen.integrations.transformers", f"flashgen.integrations.transformers {BOTH}"),
    ("import flashgen; flashgen.attention(1, 2, 3)", f"flashgen.attention {TORCH}"),
    ("import flashgen; flashgen.attention_varlen()", f"flashgen.attention_varlen {TORCH}"),
])
def test_what_needs_torch_says_so(code, message):
    out, err, rc = run_without(["torch"], code)
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last == f"ModuleNotFoundError: {message}", err


def test_the_rest_works_without_torch():
    out, err, rc = run_without(["torch"], "import flashgen; print(flashgen.__version__)")
    assert rc == 0 and out.strip() == __import__("flashgen").__version__, err


def test_register_without_transformers_says_so():
    pytest.importorskip("torch", reason="PyTorch is not installed")
    out, err, rc = run_without(["transformers"], "import flashgen.integrations.transformers as t\n"
                                                 "t.register()")
    assert rc == 1
    assert err.strip().splitlines()[-1] == (
        "ModuleNotFoundError: flashgen.integrations.transformers needs transformers "
        "(pip install transformers)"), err


FAKE_TORCH = '''"""A PyTorch that finds no GPU, as on a CPU-only machine."""
class cuda:
    @staticmethod
    def is_available():
        return False
'''


def test_gpu_modules_skip_without_a_gpu(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    gpu_modules = sorted(f for f in os.listdir(HERE) if f.startswith("test_gpu_"))
    assert gpu_modules
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        f"--basetemp={tmp_path / 'inner'}", *gpu_modules],
                       cwd=HERE, env=env, capture_output=True, text=True)
    # 5: pytest collected no test to run, every module having skipped itself
    assert r.returncode == 5, r.stdout + r.stderr
    assert f"{len(gpu_modules)} skipped" in r.stdout, r.stdout
    assert "no CUDA GPU" in r.stdout and "error" not in r.stdout.lower(), r.stdout

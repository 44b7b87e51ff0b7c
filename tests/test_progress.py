"""Progress of long work: the command line's (compile over several targets,
bundle build, demo) and the Python package's tune.

On a terminal (stderr a terminal, stdout not a pipe) the line
"flashgen: WHAT DONE/TOTAL (P%), ELAPSED elapsed, about LEFT left: LABEL" is
redrawn in place ("\\r", the line, "\\033[K") and erased before the output's
own lines; with stdout or stderr piped nothing is shown; FLASHGEN_PROGRESS=1
shows it anyway (a line per update off a terminal, then "flashgen: WHAT
finished in ELAPSED"), FLASHGEN_PROGRESS=0 never; another value is warned
about. Terminals are pseudo-terminals (pty). tune and bench need a GPU, so
only their Python side (tune over a stand-in context) is run here; they share
the code that is.

usage: test_progress.py PATH-TO-flashgen PYTHON-PACKAGE-DIR [PATH-TO-libflashgen.so]
"""
import io
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile

cli = sys.argv[1]
python_dir = sys.argv[2]
library = sys.argv[3] if len(sys.argv) > 3 else None

failed = 0
passed = 0

LINE = re.compile(r"^flashgen: (?P<what>[a-z ]+) (?P<done>\d+)/(?P<total>\d+) \((?P<pct>\d+)%\), "
                  r"(?P<took>[0-9.]+s|\d+m\d\ds|\d+h\d\dm) elapsed"
                  r"(, about (?P<left>[0-9.]+s|\d+m\d\ds|\d+h\d\dm) left)?(: (?P<label>.*))?$")


def check(ok, what, detail=""):
    global failed, passed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}")
        for line in str(detail).splitlines()[:20]:
            print(f"  | {line}")


def environment(**extra):
    env = dict(os.environ)
    for name in ("FLASHGEN_PROGRESS", "FLASHGEN_COMPILE_LOG", "FLASHGEN_CACHE"):
        env.pop(name, None)
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def run_piped(args, **env):
    r = subprocess.run([cli, *args], capture_output=True, text=True, env=environment(**env),
                       timeout=900)
    return r.returncode, r.stdout, r.stderr


def run_on_terminal(args, stdout_piped=False, **env):
    """args with stderr (and stdout, unless stdout_piped) on a pseudo-terminal:
    (status, what the terminal received, what the pipe received)."""
    master, slave = pty.openpty()
    out = subprocess.PIPE if stdout_piped else slave
    p = subprocess.Popen([cli, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=slave,
                         env=environment(**env), close_fds=True)
    os.close(slave)
    received = b""
    while True:
        ready, _, _ = select.select([master], [], [], 900)
        if not ready:
            p.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the last writer closed it
            break
        if not chunk:
            break
        received += chunk
    piped = p.stdout.read().decode() if stdout_piped else ""
    p.wait()
    os.close(master)
    return p.returncode, received.decode(errors="replace"), piped


def progress_lines(text):
    return [line for line in text.splitlines() if LINE.match(line)]


def check_lines(lines, what, total, labels=None):
    """Lines a line per update: 0..total-1 done in order (bundle build also
    total), percentages and estimates consistent."""
    parsed = [LINE.match(line) for line in lines]
    check(parsed and all(m["what"] == what and int(m["total"]) == total for m in parsed),
          f"{what}: every line is '{what} N/{total}'", "\n".join(lines))
    dones = [int(m["done"]) for m in parsed]
    check(dones == sorted(dones) and dones and dones[0] == 0 and dones[-1] >= total - 1,
          f"{what}: done counts from 0 up to at least {total - 1}", dones)
    for m in parsed:
        done = int(m["done"])
        check(int(m["pct"]) == 100 * done // total, f"{what}: the percentage of {done}/{total}",
              m.group(0))
        check((m["left"] is not None) == (0 < done < total),
              f"{what}: an estimate once something is done and until all is", m.group(0))
    if labels is not None:
        check([m["label"] for m in parsed] == labels, f"{what}: the labels", "\n".join(lines))


targets = ["t4", "a100", "rtx3090", "l4", "h100"]
compile_args = ["compile", "-d", "64", "--all-targets"]

# piped (as ctest runs it): stdout and stderr as without progress, no line;
# the kernels compiled first, so that every run's table says "cached"
run_piped(compile_args)
status, out, err = run_piped(compile_args)
check(status == 0, "compile --all-targets runs", out + err)
check(not progress_lines(err) and "\r" not in err and "\033" not in err,
      "compile: nothing on a piped stderr", err)
check(len(out.splitlines()) == 1 + len(targets), "compile: a header and a row per target", out)
plain = out

# FLASHGEN_PROGRESS=1 off a terminal: a line per update, the output unchanged
status, out, err = run_piped(compile_args, FLASHGEN_PROGRESS="1")
check(status == 0 and out == plain, "compile with FLASHGEN_PROGRESS=1: the same output", out)
lines = progress_lines(err)
check_lines(lines, "compile", len(targets), targets)
check(err.rstrip("\n").splitlines()[-1].startswith("flashgen: compile finished in "),
      "compile: the last line says how long it took", err)
check("\r" not in err and "\033" not in err, "compile: no terminal codes off a terminal", err)

# FLASHGEN_PROGRESS=0 and values not understood
status, out, err = run_piped(compile_args, FLASHGEN_PROGRESS="0")
check(status == 0 and not err, "compile with FLASHGEN_PROGRESS=0: nothing on stderr", err)
status, out, err = run_piped(compile_args, FLASHGEN_PROGRESS="yes")
check(status == 0 and err.count("flashgen: warning: FLASHGEN_PROGRESS=yes is not understood") == 1
      and not progress_lines(err), "FLASHGEN_PROGRESS=yes: one warning, no progress off a terminal",
      err)

# one target: nothing to count
status, out, err = run_piped(["compile", "-d", "64", "--target", "h100"], FLASHGEN_PROGRESS="1")
check(status == 0 and not progress_lines(err), "compile of one target: no progress", err)

# on a terminal: redrawn in place, erased before each row of the output
status, screen, _ = run_on_terminal(compile_args)
check(status == 0, "compile on a terminal runs", screen)
drawn = re.findall(r"\r(flashgen: compile [^\r\n\033]*)\033\[K", screen)
check(len(drawn) == len(targets) and all(LINE.match(x) for x in drawn),
      "compile on a terminal: a line per target, redrawn in place", repr(screen))
rows = [line for line in screen.replace("\r\n", "\n").split("\n") if "fg_fwd_" in line]
check(len(rows) == len(targets) and all(not LINE.search(r.split("\r\033[K")[-1]) for r in rows),
      "compile on a terminal: the progress is erased before each row", repr(screen))
check(screen.replace("\r\n", "\n").rstrip("\n").split("\n")[-1].split("\r\033[K")[-1]
      .startswith("h100 "),
      "compile on a terminal: the table ends the output", repr(screen))

# on a terminal with stdout piped, or FLASHGEN_PROGRESS=0: quiet
status, screen, piped = run_on_terminal(compile_args, stdout_piped=True)
check(status == 0 and "flashgen: compile" not in screen and piped == plain,
      "compile with stdout piped: no progress on the terminal", repr(screen))
status, screen, _ = run_on_terminal(compile_args, FLASHGEN_PROGRESS="0")
check(status == 0 and "flashgen: compile" not in screen,
      "compile on a terminal with FLASHGEN_PROGRESS=0: no progress", repr(screen))

# bundle build: a line per kernel built
tmp = tempfile.mkdtemp(prefix="fg_progress_")
try:
    bundle = ["bundle", "build", "--out", os.path.join(tmp, "b"), "--target", "a100",
              "--head-dims", "32,64", "--dtypes", "fp16", "--masks", "none", "--dropout", "off",
              "--passes", "forward", "-j", "1"]
    status, out, err = run_piped(bundle)
    check(status == 0 and not progress_lines(err), "bundle build piped: no progress", out + err)
    status, out, err = run_piped(bundle, FLASHGEN_PROGRESS="1")
    check(status == 0, "bundle build with FLASHGEN_PROGRESS=1 runs", out + err)
    lines = progress_lines(err)
    check_lines(lines, "bundle build", 2)
    check([int(LINE.match(x)["done"]) for x in lines] == [0, 1, 2],
          "bundle build: 0, 1 and 2 of 2 done", err)
    status, screen, _ = run_on_terminal(bundle)
    check(status == 0 and len(re.findall(r"\rflashgen: bundle build \d/2[^\r\n\033]*\033\[K",
                                         screen)) == 3,
          "bundle build on a terminal: redrawn in place", repr(screen))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

# demo: without a GPU 5 targets x 8 specs, with one the compile, check and timing
status, out, err = run_piped(["demo"], FLASHGEN_PROGRESS="1")
check(status == 0, "demo runs", out + err)
lines = progress_lines(err)
total = int(LINE.match(lines[0])["total"]) if lines else 0
check(total in (40, 3), "demo: 40 compiles without a GPU, 3 steps with one", err)
if lines:
    check_lines(lines, "demo", total)

# the Python package's tune: the same line, over a stand-in for the device
if library:
    os.environ["FLASHGEN_LIBRARY"] = library
    sys.path.insert(0, python_dir)
    import flashgen  # noqa: E402
    from flashgen import _native, tuning  # noqa: E402

    check(tuning.progress_line("tune", 0, 3, 0.04, "x") ==
          "flashgen: tune 0/3 (0%), 0.0s elapsed: x", "progress_line at the start")
    check(tuning.progress_line("tune", 1, 3, 65, None) ==
          "flashgen: tune 1/3 (33%), 1m05s elapsed, about 2m10s left", "progress_line midway")
    check([tuning._duration(x) for x in (4.24, 37.2, 185, 3725)] ==
          ["4.2s", "37s", "3m05s", "1h02m"],
          "durations as the command line writes them")

    class FakeContext:
        def __init__(self):
            self.calls = []

        def tune(self, spec, pass_, seqlen):
            self.calls.append((pass_, seqlen))
            return {"seqlen_bucket": seqlen}

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    fake = FakeContext()
    real_context, real_stderr = _native.device_context, sys.stderr
    _native.device_context = lambda index: fake
    try:
        for env, stream, want in ((None, io.StringIO(), "quiet"), ("1", io.StringIO(), "lines"),
                                  (None, Terminal(), "terminal"), ("0", Terminal(), "quiet")):
            os.environ.pop("FLASHGEN_PROGRESS", None)
            if env is not None:
                os.environ["FLASHGEN_PROGRESS"] = env
            sys.stderr = stream
            reports = flashgen.tune(128, "bf16", mask="causal", seqlen=[1024, 4096, 16384],
                                    device=0)
            one = flashgen.tune(64, "fp16", seqlen=2048, device=0)
            sys.stderr = real_stderr
            text = stream.getvalue()
            check([r["seqlen_bucket"] for r in reports] == [1024, 4096, 16384] and
                  one == {"seqlen_bucket": 2048}, "tune: a report per length, one for one")
            if want == "quiet":
                check(text == "", f"tune with FLASHGEN_PROGRESS={env}, not a terminal: quiet", text)
            elif want == "lines":
                lines = progress_lines(text)
                check_lines(lines[:3], "tune", 3, [f"d128 bf16 causal seqlen {n}"
                                                   for n in (1024, 4096, 16384)])
                check(text.count("flashgen: tune finished in ") == 2 and len(lines) == 4,
                      "tune with FLASHGEN_PROGRESS=1: a line per length and an end", text)
            else:
                drawn = re.findall(r"\r(flashgen: tune [^\r\n\033]*)\033\[K", text)
                check(len(drawn) == 4 and all(LINE.match(x) for x in drawn) and
                      text.endswith("\r\033[K") and "\n" not in text,
                      "tune on a terminal: redrawn in place and erased at the end", repr(text))
        os.environ.pop("FLASHGEN_PROGRESS", None)
        stream = io.StringIO()
        sys.stderr = stream
        flashgen.tune(128, seqlen=[512, 1024], device=0, progress=True)
        flashgen.tune(128, seqlen=[512, 1024], device=0, progress=False)
        sys.stderr = real_stderr
        check(len(progress_lines(stream.getvalue())) == 2, "tune(progress=True/False)",
              stream.getvalue())
    finally:
        _native.device_context, sys.stderr = real_context, real_stderr
        os.environ.pop("FLASHGEN_PROGRESS", None)
else:
    print("no shared library: the Python package's tune is not checked")

print(f"test_progress: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

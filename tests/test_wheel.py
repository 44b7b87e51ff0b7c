"""The Python wheel, built from the source tree as `pip wheel .` builds it:
its files and tag, its licence (LICENSE in the dist-info, named in the
metadata) and authors, what libflashgen.so needs and where it finds its
Lua, and an install into a fresh virtual environment that creates an
offline context through ctypes and puts a `flashgen` command on PATH. Everything is made in a temporary folder, removed afterwards.

    python3 tests/test_wheel.py SOURCE_DIR

Builds without build isolation when scikit-build-core is installed here
(no network needed), else isolated (pip fetches the build requirements)."""
import glob
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

# Libraries libflashgen.so and the command line may need: glibc's (the
# dynamic loader among them: thread-local storage comes from it) and, for the
# library only, the Lua copy beside it. Never NVRTC or the driver: dlopened.
GLIBC = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "ld-linux-x86-64.so.2",
         "ld-linux-aarch64.so.1"}
LUA = "liblua5.4.so.0"
BINARIES = {"flashgen/lib/libflashgen.so", "flashgen/lib/" + LUA, "flashgen/bin/flashgen"}

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def run(cmd, env=None, cwd=None):
    return subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def dynamic_section(path):
    """NEEDED entries and RUNPATH/RPATH of an ELF file, from readelf -d."""
    out = run(["readelf", "-d", path]).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    runpath = re.findall(r"\(RUNPATH\)\s+Library runpath: \[(.*?)\]", out)
    rpath = re.findall(r"\(RPATH\)\s+Library rpath: \[(.*?)\]", out)
    return needed, runpath, rpath


def header_version(src):
    with open(os.path.join(src, "include", "flashgen.h")) as f:
        return re.search(r'#define FLASHGEN_VERSION "([^"]+)"', f.read()).group(1)


def build_wheel(src, out, log):
    cmd = [sys.executable, "-m", "pip", "wheel", src, "-w", out, "--no-deps",
           "--disable-pip-version-check"]
    if importlib.util.find_spec("scikit_build_core"):
        cmd.append("--no-build-isolation")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2),
               PIP_ROOT_USER_ACTION="ignore")
    print("$ " + " ".join(cmd), flush=True)
    r = run(cmd, env=env)
    with open(log, "w") as f:
        f.write(r.stdout)
    if r.returncode != 0:
        print(r.stdout[-6000:])
    return r.returncode == 0


def check_wheel(path, version, tmp, src):
    name = os.path.basename(path)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    check(name == "flashgen-%s-py3-none-%s.whl" % (version, platform),
          "wheel name %s: version %s, tag py3-none-%s" % (name, version, platform))
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        wheel_meta = z.read("flashgen-%s.dist-info/WHEEL" % version).decode()
        metadata = z.read("flashgen-%s.dist-info/METADATA" % version).decode()
        entry_points = z.read("flashgen-%s.dist-info/entry_points.txt" % version).decode() \
            if "flashgen-%s.dist-info/entry_points.txt" % version in names else ""
        licences = [z.read(n).decode() for n in names if n.startswith("flashgen-%s.dist-info/"
                    % version) and os.path.basename(n) == "LICENSE"]
        z.extractall(os.path.join(tmp, "unpacked"))
    check("Tag: py3-none-%s" % platform in wheel_meta and "Root-Is-Purelib: false" in wheel_meta,
          "WHEEL says py3-none-%s, platlib" % platform)
    with open(os.path.join(src, "LICENSE")) as f:
        check(licences == [f.read()], "the dist-info holds LICENSE, as in the source tree")
    fields = re.findall(r"^([A-Za-z-]+): (.*)$", metadata.split("\n\n")[0], re.M)
    check(("License", "MIT") in fields or ("License-Expression", "MIT") in fields,
          "METADATA names the MIT licence")
    check(("Author", "flashgen developers") in fields, "METADATA names the authors")
    check(("Provides-Extra", "transformers") in fields, "a transformers extra")
    check(re.search(r"^\[console_scripts\]\nflashgen = flashgen\.__main__:main$", entry_points, re.M),
          "a flashgen console script running flashgen.__main__:main")
    files = [n for n in names if not n.startswith("flashgen-%s.dist-info/" % version)]
    others = [n for n in files if n not in BINARIES and not
              (n.startswith("flashgen/") and n.endswith(".py"))]
    check(BINARIES <= set(files), "the wheel has %s" % ", ".join(sorted(BINARIES)))
    check("flashgen/__init__.py" in files and "flashgen/_native.py" in files,
          "the wheel has the Python sources")
    check(not others, "nothing else in the wheel: %s" % (others or "none"))
    links = [i.filename for i in infos if stat.S_ISLNK(i.external_attr >> 16)]
    check(not links, "no symlinks in the wheel: %s" % (links or "none"))
    cli = [i for i in infos if i.filename == "flashgen/bin/flashgen"]
    check(cli and cli[0].external_attr >> 16 & 0o111, "flashgen/bin/flashgen is executable")

    lib = os.path.join(tmp, "unpacked", "flashgen", "lib", "libflashgen.so")
    needed, runpath, rpath = dynamic_section(lib)
    check(set(needed) <= GLIBC | {LUA} and LUA in needed,
          "libflashgen.so needs only glibc and %s: %s" % (LUA, needed))
    check(runpath == ["$ORIGIN"] and not rpath,
          "libflashgen.so has RUNPATH $ORIGIN (RUNPATH %s, RPATH %s)" % (runpath, rpath))
    exported = run(["nm", "-D", "--defined-only", lib]).stdout.split()[2::3]
    check(exported and all(s.startswith("fg_") for s in exported),
          "libflashgen.so exports only fg_* (%d symbols)" % len(exported))
    needed, _, _ = dynamic_section(os.path.join(tmp, "unpacked", "flashgen", "bin", "flashgen"))
    check(set(needed) <= GLIBC, "flashgen/bin/flashgen needs only glibc: %s" % needed)


# Run in the virtual environment: create an offline context through ctypes,
# and report which files libflashgen.so and Lua were loaded from.
PROBE = r"""
import ctypes, flashgen
lib = flashgen._native._lib
ctx = ctypes.c_void_p()
rc = lib.fg_context_create(ctypes.byref(ctx), b"h100")
lib.fg_context_target.restype = ctypes.c_char_p
print("rc", rc)
if rc == 0:
    print("target", lib.fg_context_target(ctx).decode())
    lib.fg_context_destroy(ctx)
with open("/proc/self/maps") as f:
    for path in sorted({l.split()[-1] for l in f if "libflashgen" in l or "liblua" in l}):
        print("mapped", path)
"""


def hidden_lua_prefix():
    """A command prefix that runs a program with the system's Lua library
    replaced by an empty file, in a mount namespace of its own, or None where
    that is not allowed (or there is no system Lua to hide)."""
    system = [p for p in glob.glob("/usr/lib/*/liblua5.4.so.0*") if os.path.isfile(p)
              and not os.path.islink(p)]
    if not system or not shutil.which("unshare"):
        return None
    hide = "; ".join("mount --bind /dev/null %s" % p for p in system)
    for flags in (["--mount"], ["--mount", "--map-root-user"]):
        prefix = ["unshare"] + flags + ["sh", "-c", hide + ' && exec "$@"', "sh"]
        if run(prefix + ["true"]).returncode == 0:
            return prefix
    return None


def check_installed(wheel, tmp):
    venv = os.path.join(tmp, "venv")
    r = run([sys.executable, "-m", "venv", venv])
    if not check(r.returncode == 0, "python3 -m venv"):
        print(r.stdout)
        return
    py = os.path.join(venv, "bin", "python")
    r = run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
             wheel])
    if not check(r.returncode == 0, "pip install --no-index --no-deps the wheel"):
        print(r.stdout)
        return
    pkg = run([py, "-c", "import flashgen, os; print(os.path.dirname(flashgen.__file__))"],
              cwd=tmp).stdout.strip()
    check(pkg.startswith(venv), "flashgen imported from the venv: %s" % pkg)
    libdir = os.path.join(os.path.realpath(pkg), "lib")
    # A clean environment: no LD_LIBRARY_PATH, no FLASHGEN_LIBRARY.
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "", "HOME": tmp,
           "FLASHGEN_CACHE_DIR": os.path.join(tmp, "cache")}
    ldd = run(["ldd", os.path.join(libdir, "libflashgen.so")], env=env).stdout
    lua = re.search(r"liblua5\.4\.so\.0 => (\S+)", ldd)
    check(lua and lua.group(1) == os.path.join(libdir, LUA),
          "ldd resolves %s to the package's copy: %s" % (LUA, lua.group(1) if lua else ldd))

    prefix = hidden_lua_prefix()
    print("system Lua %s" % ("hidden in a mount namespace" if prefix else
                             "left in place (no mount namespace here)"))
    r = run((prefix or []) + [py, "-c", PROBE], env=env, cwd=tmp)
    print(r.stdout.strip())
    check("rc 0" in r.stdout.split("\n"), "fg_context_create(&ctx, \"h100\") returns 0")
    mapped = [os.path.realpath(p) for p in re.findall(r"^mapped (.+)$", r.stdout, re.M)]
    check(os.path.join(libdir, "libflashgen.so") in mapped and
          os.path.join(libdir, LUA) in mapped and len(mapped) == 2,
          "libflashgen.so and Lua loaded from the package only: %s" % mapped)
    cli = os.path.join(pkg, "bin", "flashgen")
    r = run([cli, "plan", "-d", "64", "--target", "a100"], env=env)
    check(r.returncode == 0 and "Br=" in r.stdout, "flashgen/bin/flashgen plan runs")
    # the console script, found on PATH as pip puts it there
    script_env = dict(env, PATH=os.path.join(venv, "bin") + ":" + env["PATH"])
    script = shutil.which("flashgen", path=script_env["PATH"])
    r = run(["flashgen", "plan", "-d", "64", "--target", "a100"], env=script_env, cwd=tmp)
    check(script == os.path.join(venv, "bin", "flashgen") and r.returncode == 0 and
          "Br=" in r.stdout, "`flashgen plan` runs the console script %s: %s" %
          (script, r.stdout[-300:]))


def main():
    src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    version = header_version(src)
    tmp = tempfile.mkdtemp(prefix="fg-wheel-")
    try:
        dist = os.path.join(tmp, "dist")
        if check(build_wheel(src, dist, os.path.join(tmp, "build.log")), "pip wheel " + src):
            wheels = glob.glob(os.path.join(dist, "flashgen-*.whl"))
            if check(len(wheels) == 1, "one flashgen wheel built: %s" % wheels):
                check_wheel(wheels[0], version, tmp, src)
                check_installed(wheels[0], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_wheel: %d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The documentation cannot rot: README.md and docs/*.md are read as a new
user reads them, and what they show is run.

- The README's two commands are there, and .ci/run runs its test command as
  written; the README stays short (at most 250 lines).
- Every relative link and picture of README.md and docs/*.md names a file
  that exists, and a #section that the file has (GitHub's anchors).
- Command lines: each line of a code block (fenced, or indented four spaces)
  that starts with `flashgen ` or `build/flashgen ` (after an optional `$ `
  and VAR=value settings; a trailing backslash continues it, a `#` comment
  ends it, as do a pipe or a redirection) is run with this build's command
  line, each document's in their order in a fresh folder of its own, with a
  fresh kernel cache (shared by all). Each must exit 0. Skipped by rule, and
  listed as skipped: `check`, `bench` and `tune`, which need a GPU, and
  `bundle build ... --all`, which takes tens of minutes.
- Examples: each ```c block that includes <flashgen.h> compiles against the
  header (cc -fsyntax-only -Wall -Werror); each ```python block parses;
  those that make an offline context (`flashgen.Context(`) run with this
  build's library, and those that start by importing torch (whole programs)
  run where PyTorch sees a GPU (else they are listed as skipped).

usage: test_docs.py SOURCE-DIR PATH-TO-flashgen [PATH-TO-libflashgen.so] [CC]
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

src = os.path.abspath(sys.argv[1])
cli = os.path.abspath(sys.argv[2])
library = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
cc = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
cc = cc or shutil.which("cc") or shutil.which("gcc")

GPU_COMMANDS = {"check", "bench", "tune"}
README_MAX_LINES = 250

failed = 0
passed = 0
skipped = []


def fail(what, detail=""):
    global failed
    failed += 1
    print(f"FAIL: {what}")
    for line in str(detail).splitlines()[-20:]:
        print(f"  | {line}")


def ok():
    global passed
    passed += 1


documents = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))


def rel(path):
    return os.path.relpath(path, src)


# ---- code blocks -------------------------------------------------------------

def blocks(path):
    """(language, first line number, lines) of each code block: fenced ones
    with their info string's first word, indented ones as ''."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if m:
            fence, lang, start, body = m.group(2), m.group(3), i + 2, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            out.append((lang, start, body))
            i += 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            start, body = i + 1, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            out.append(("", start, body))
            continue
        i += 1
    return out


SETTING = r"[A-Za-z_][A-Za-z0-9_]*=\S*"
COMMAND = re.compile(rf"^(?:\$\s+)?((?:{SETTING}\s+)*)(build/flashgen|flashgen)\s+(.*)$")


def command_lines(path):
    """(line number, environment settings, arguments) of each command line."""
    found = []
    for lang, start, body in blocks(path):
        if lang not in ("", "sh", "bash", "console", "shell"):
            continue
        i = 0
        while i < len(body):
            m = COMMAND.match(body[i].strip())
            if not m:
                i += 1
                continue
            number, text = start + i, body[i].strip()
            while text.endswith("\\") and i + 1 < len(body):
                i += 1
                text = text[:-1] + " " + body[i].strip()
            i += 1
            words = shlex.split(text, comments=True)
            if words and words[0] == "$":
                words = words[1:]
            for n, word in enumerate(words):  # the command, not what the shell adds
                if word in ("|", "||", "&&", ";") or word.startswith((">", "<", "2>")):
                    words = words[:n]
                    break
            settings = {}
            while words and re.fullmatch(SETTING, words[0]):
                name, value = words.pop(0).split("=", 1)
                settings[name] = value
            found.append((number, settings, words[1:]))
    return found


# ---- the README ----------------------------------------------------------------

readme = open(documents[0], encoding="utf-8").read()
build = ".ci/setup && cmake -S . -B build && cmake --build build -j"
demo = build + " && build/flashgen demo"
test = build + " && ctest --test-dir build --output-on-failure"
for command in (demo, test):
    if re.search(r"^    " + re.escape(command) + "$", readme, re.M):
        ok()
    else:
        fail(f"README.md does not show the command '{command}' on a line of its own")
ci = [line.strip() for line in open(os.path.join(src, ".ci", "run")) if line.strip() and
      not line.startswith("#") and not line.startswith(("set ", "cd "))]
if ci == [test]:
    ok()
else:
    fail("'.ci/run' does not run the README's test command as written", "\n".join(ci))
count = readme.count("\n")
if count <= README_MAX_LINES:
    ok()
else:
    fail(f"README.md has {count} lines; a newcomer's README has at most {README_MAX_LINES} "
         "(the rest belongs in docs/)")

# ---- links ---------------------------------------------------------------------


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    seen, out = {}, set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = m.group(1).strip().lower().replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
for path in documents:
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(where):
            fail(f"{rel(path)}: the link '{target}' names no file")
        elif anchor and where.endswith(".md") and anchor not in anchors(where):
            fail(f"{rel(path)}: the link '{target}': {rel(where)} has no section '#{anchor}'",
                 ", ".join(sorted(anchors(where))))
        else:
            ok()

# ---- command lines ------------------------------------------------------------

work = tempfile.mkdtemp(prefix="fg_docs_")
environment = dict(os.environ)
for name in ("FLASHGEN_CACHE", "FLASHGEN_BUNDLE_PATH", "FLASHGEN_TUNING", "FLASHGEN_PROGRESS",
             "FLASHGEN_COMPILE_LOG", "FLASHGEN_FAMILIES"):
    environment.pop(name, None)
environment["FLASHGEN_CACHE_DIR"] = os.path.join(work, "cache")
os.makedirs(environment["FLASHGEN_CACHE_DIR"])
ran = 0
try:
    for path in documents:
        folder = os.path.join(work, os.path.basename(path))
        os.makedirs(folder)
        for number, settings, args in command_lines(path):
            where = f"{rel(path)}:{number}: flashgen {' '.join(args)}"
            if not args:
                continue
            if args[0] in GPU_COMMANDS:
                skipped.append(f"{where} (needs a GPU)")
                continue
            if args[:2] == ["bundle", "build"] and "--all" in args:
                skipped.append(f"{where} (the whole default set: tens of minutes)")
                continue
            env = dict(environment)
            env.update(settings)
            r = subprocess.run([cli, *args], cwd=folder, env=env, capture_output=True, text=True,
                               timeout=1200)
            ran += 1
            if r.returncode == 0:
                ok()
                print(f"ok: {where}")
            else:
                fail(f"{where}: exit status {r.returncode}", r.stdout + r.stderr)
finally:
    shutil.rmtree(work, ignore_errors=True)
if ran < 10:
    fail(f"only {ran} command lines found to run in README.md and docs/")

# ---- examples ------------------------------------------------------------------

try:
    import torch
    gpu = torch.cuda.is_available()
except ImportError:
    gpu = False

scratch = tempfile.mkdtemp(prefix="fg_docs_examples_")
try:
    for path in documents:
        for lang, start, body in blocks(path):
            code, where = "\n".join(body) + "\n", f"{rel(path)}:{start}"
            if lang == "c" and "#include <flashgen.h>" in code:
                if not cc:
                    skipped.append(f"{where}: a C example (no C compiler)")
                    continue
                c = os.path.join(scratch, "example.c")
                open(c, "w").write(code)
                r = subprocess.run([cc, "-std=c11", "-fsyntax-only", "-Wall", "-Werror",
                                    "-I", os.path.join(src, "include"), c],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    ok()
                    print(f"ok: {where}: the C example compiles")
                else:
                    fail(f"{where}: the C example does not compile", r.stderr)
            elif lang == "python":
                try:
                    compile(code, where, "exec")
                    ok()
                except SyntaxError as e:
                    fail(f"{where}: the Python example does not parse", e)
                    continue
                runs = "flashgen.Context(" in code and library
                if code.lstrip().startswith("import torch"):
                    runs = gpu and library
                    if not runs:
                        skipped.append(f"{where}: a PyTorch example (needs PyTorch and a GPU)")
                if runs:
                    env = dict(environment)
                    env.update({"FLASHGEN_LIBRARY": library,
                                "FLASHGEN_CACHE_DIR": os.path.join(scratch, "cache"),
                                "PYTHONPATH": os.path.join(src, "python"),
                                "PYTHONDONTWRITEBYTECODE": "1"})
                    r = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env,
                                       capture_output=True, text=True, timeout=1200)
                    if r.returncode == 0:
                        ok()
                        print(f"ok: {where}: the Python example runs")
                    else:
                        fail(f"{where}: the Python example fails", r.stdout + r.stderr)
finally:
    shutil.rmtree(scratch, ignore_errors=True)

for s in skipped:
    print(f"skipped: {s}")
print(f"test_docs: {passed} passed, {failed} failed, {len(skipped)} skipped")
sys.exit(1 if failed else 0)

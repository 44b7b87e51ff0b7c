"""python -m flashgen ..., and the `flashgen` command pip installs (the same
main): the command line (plan, source, compile, check, bench, tune, cache,
bundle, demo), the executable shipped in the package."""
import os
import sys

from ._native import _HERE


def main():
    cli = os.environ.get("FLASHGEN_CLI") or os.path.join(_HERE, "bin", "flashgen")
    if not os.access(cli, os.X_OK):
        sys.exit(f"flashgen: the command line is not installed at {cli}")
    os.execv(cli, [cli] + sys.argv[1:])


if __name__ == "__main__":
    main()

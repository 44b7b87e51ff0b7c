"""The shared C library, loaded with ctypes.

Where it is: $FLASHGEN_LIBRARY when set (a build tree's libflashgen.so), else
lib/libflashgen.so inside this package (the wheel's copy, next to the Lua
library it needs)."""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    return os.environ.get("FLASHGEN_LIBRARY") or os.path.join(_HERE, "lib", "libflashgen.so")


_lib = ctypes.CDLL(library_path())

#!/usr/bin/env bash
# The installed C library as its users see it: `cmake --install` into a
# temporary prefix, then examples/hello.c built against it with pkg-config,
# with a plain `cc ... -lflashgen`, with a CMake project's find_package, and
# statically from libflashgen.a, each run and printing the line
# docs/c-library.md shows; libflashgen.so exports exactly the functions the header declares.
# The prefix is removed afterwards.
#   test_install.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
tmp=$(mktemp -d /tmp/fg-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
so=$(find "$prefix" -name libflashgen.so)
[ -n "$so" ] || fail "no libflashgen.so installed"
libdir=$(dirname "$so") # lib, or lib/<multiarch> under /usr
for f in "$prefix/bin/flashgen" "$prefix/include/flashgen.h" "$libdir/libflashgen.a" \
         "$libdir/pkgconfig/flashgen.pc" "$libdir/cmake/flashgen/flashgen-config.cmake" \
         "$libdir/cmake/flashgen/flashgen-config-version.cmake"; do
  [ -f "$f" ] || fail "$f not installed"
done
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

# Exported: the header's functions, nothing else.
nm -D --defined-only "$so" | awk '{print $3}' | sort > "$tmp/exported"
grep -oE '\bfg_[a-z0-9_]+\(' "$prefix/include/flashgen.h" | tr -d '(' | sort -u > "$tmp/declared"
diff "$tmp/declared" "$tmp/exported" || fail "libflashgen.so exports other than the header's functions"
echo "libflashgen.so exports the header's $(wc -l < "$tmp/declared") functions and nothing else"

# What hello prints is what docs/c-library.md says it prints (the comment after ./hello).
want=$(sed -n 's|^ *LD_LIBRARY_PATH=$P/lib ./hello *# ||p' "$src/docs/c-library.md")
[ -n "$want" ] || fail "docs/c-library.md shows no output of ./hello"
run() { # name, then the program: it must print the plan docs/c-library.md shows
  out=$(LD_LIBRARY_PATH=$libdir "${@:2}") || fail "$1: exit $?"
  [ "$out" = "$want" ] || fail "$1 printed '$out'; docs/c-library.md says '$want'"
  echo "$1: $out"
}
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc "$src/examples/hello.c" -o "$tmp/hello-pc" $(pkg-config --cflags --libs flashgen)
run pkg-config "$tmp/hello-pc"
cc -I"$prefix/include" "$src/examples/hello.c" -o "$tmp/hello-cc" -L"$libdir" -lflashgen
run "cc -lflashgen" "$tmp/hello-cc"
# static: libflashgen.a and what Libs.private names (Lua, libm, libdl, pthreads)
static_libs=$(pkg-config --static --libs flashgen)
cc "$src/examples/hello.c" -o "$tmp/hello-static" $(pkg-config --cflags flashgen) \
  ${static_libs/-lflashgen/-l:libflashgen.a}
readelf -d "$tmp/hello-static" | grep -q 'NEEDED.*libflashgen' && fail "static build needs libflashgen.so"
run "static (libflashgen.a)" "$tmp/hello-static"

mkdir "$tmp/project"
cp "$src/examples/hello.c" "$tmp/project/"
cat > "$tmp/project/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(hello C)
find_package(flashgen 99 QUIET)
if(flashgen_FOUND)
  message(FATAL_ERROR "flashgen ${flashgen_VERSION} accepted as version 99")
endif()
find_package(flashgen 0.1 REQUIRED)
add_executable(hello hello.c)
target_link_libraries(hello PRIVATE flashgen::flashgen)
CMAKE
cmake -S "$tmp/project" -B "$tmp/project/build" -DCMAKE_PREFIX_PATH="$prefix" > "$tmp/cmake.log" 2>&1 &&
  cmake --build "$tmp/project/build" >> "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "find_package project"; }
run "find_package(flashgen)" "$tmp/project/build/hello"

# the installed command line carries the library and Lua in itself
readelf -d "$prefix/bin/flashgen" | grep -qE 'NEEDED.*(libflashgen|liblua)' && fail "bin/flashgen needs a shared flashgen or Lua"
"$prefix/bin/flashgen" plan -d 64 --target a100 > /dev/null || fail "bin/flashgen plan"
echo "test_install: passed"

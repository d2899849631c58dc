#!/bin/sh
# Installs the client to a temporary prefix and builds a program against it the
# two ways a user would: pkg-config and find_package(gpucd), shared and static.
#   install_test.sh BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR
set -eu
build=$1
consumer=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" --component client >"$work/install.log"

fail() { echo "install_test: $*" >&2; exit 1; }

# The files, wherever this platform puts libraries.
test -f "$prefix/include/gpucd.h" || fail "gpucd.h not installed"
test -x "$prefix/bin/gpucdctl" || fail "gpucdctl not installed"
pc=$(find "$prefix" -name gpucd.pc)
test -n "$pc" || fail "gpucd.pc not installed"
libdir=$(dirname "$(dirname "$pc")")
test -f "$libdir/libgpucd.a" || fail "libgpucd.a not in $libdir"
test -f "$libdir/cmake/gpucd/gpucdConfig.cmake" || fail "no CMake package in $libdir/cmake/gpucd"
soname=$(readelf -d "$libdir/libgpucd.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
test "$soname" = libgpucd.so.0 || fail "SONAME is '$soname', want libgpucd.so.0"
test -e "$libdir/$soname" || fail "$soname missing"
# Only the public API is exported: no wire_* or protobuf-c gpucd__v1__* symbols.
leaked=$(nm -D --defined-only "$libdir/libgpucd.so" | awk '{print $3}' | grep -v '^gpucd_[a-z]' | grep -v '^GPUCD_0$' || true)
test -z "$leaked" || fail "libgpucd.so exports more than gpucd_*: $leaked"
# Internal headers stay private.
test ! -e "$prefix/include/internal.h" || fail "internal.h was installed"
test ! -e "$prefix/include/wire.h" || fail "wire.h was installed"

missing="ipc://$work/nobody-listens.sock"

# pkg-config, shared.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
test "$(pkg-config --modversion gpucd)" = 0.1.0 || fail "pkg-config --modversion"
cc -std=c11 -Wall -Wextra -Werror "$consumer/consumer.c" $(pkg-config --cflags --libs gpucd) \
   -Wl,-rpath,"$libdir" -o "$work/consumer_pc"
"$work/consumer_pc" "$missing"
readelf -d "$work/consumer_pc" | grep -q 'NEEDED.*libgpucd.so.0' || fail "consumer_pc does not use libgpucd.so.0"
# pkg-config, static: the archive holds the wire code itself; nng and protobuf-c come from the system.
cc -std=c11 -Wall -Wextra -Werror "$consumer/consumer.c" $(pkg-config --cflags gpucd) \
   "$libdir/libgpucd.a" $(pkg-config --static --libs gpucd | sed 's/-lgpucd//') \
   -o "$work/consumer_pc_static"
"$work/consumer_pc_static" "$missing"
if readelf -d "$work/consumer_pc_static" | grep -q 'NEEDED.*libgpucd'; then
  fail "consumer_pc_static links libgpucd dynamically"
fi

# find_package(gpucd).
cmake -S "$consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_RPATH="$libdir" >"$work/configure.log"
cmake --build "$work/cmake-build" >"$work/build.log"
"$work/cmake-build/consumer_shared" "$missing"
"$work/cmake-build/consumer_static" "$missing"
echo "install_test: ok ($prefix)"

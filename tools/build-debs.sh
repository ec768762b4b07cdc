#!/usr/bin/env bash
# Builds ivcuda's three Debian packages into OUTDIR (docs/operating.md,
# "Packages"; packaging/deb/packages.cmake says what each holds):
#   ivcuda-host_<version>_amd64.deb       ivcudad, ivcudactl, systemd unit, configuration
#   ivcuda-guest_<version>_amd64.deb      libcuda.so.1 through ld.so.conf.d, udev rule
#   ivcuda-uio-dkms_<version>_all.deb     the guest kernel driver as DKMS source
# <version> is the project's CMake version.
#
# usage: tools/build-debs.sh OUTDIR [BUILD_DIR]
#   BUILD_DIR  a configured build tree to package; its packaged targets are
#              built first. Default: build/deb, configured here from the
#              default preset (release with debug info) without the tests.
# Prints the packages' paths, one a line. Needs cmake/cpack and dpkg-dev
# (dpkg-shlibdeps works out the Depends: line).
set -euo pipefail

die() { echo "build-debs: $*" >&2; exit 1; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $# -ge 1 && $# -le 2 && $1 != -* ]] || die "usage: tools/build-debs.sh OUTDIR [BUILD_DIR]"
outdir=$1
build=${2:-}

for tool in cmake cpack dpkg-shlibdeps dpkg-deb; do
	command -v "$tool" >/dev/null || die "$tool is missing (apt-get install cmake dpkg-dev)"
done

if [[ -z $build ]]; then
	build=$repo/build/deb
	export PATH=/usr/local/cuda/bin:$PATH
	cmake --preset default -S "$repo" -B "$build" -DIVCUDA_BUILD_TESTS=OFF >/dev/null
fi
[[ -f $build/CPackConfig.cmake ]] ||
	die "$build has no CPackConfig.cmake: not a configured ivcuda build tree (or a fuzz build)"
# Packages hold what users run: never a sanitizer build.
sanitize=$(sed -n 's/^IVCUDA_SANITIZE:[A-Z]*=//p' "$build/CMakeCache.txt")
[[ -z $sanitize ]] || die "$build is a sanitizer build (IVCUDA_SANITIZE=$sanitize); package a default-preset build"

cmake --build "$build" --target ivcuda_package_files >/dev/null ||
	die "building the packaged targets in $build failed (cmake --build $build --target ivcuda_package_files)"

# cpack leaves its staging trees beside the packages: keep them in the build
# tree and hand only the .deb files over.
work=$build/packaging/deb/cpack
rm -rf "$work"
mkdir -p "$work" "$outdir"
if ! cpack --config "$build/CPackConfig.cmake" -B "$work" >"$work.log" 2>&1; then
	cat "$work.log" >&2
	die "cpack failed (log above, also in $work.log)"
fi
shopt -s nullglob
debs=("$work"/*.deb)
[[ ${#debs[@]} -eq 3 ]] || { cat "$work.log" >&2; die "cpack made ${#debs[@]} packages, not 3"; }
for deb in "${debs[@]}"; do
	mv -f "$deb" "$outdir/"
	echo "$(cd "$outdir" && pwd)/$(basename "$deb")"
done

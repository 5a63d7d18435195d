#!/usr/bin/env bash
# Builds the Debian package gasloc_<version>_amd64.deb with CPack from a build directory and checks
# its Depends (scripts/check_deb_depends.sh). Installs nothing; prints the package's path.
#   scripts/package.sh                  # build/ -> build/package/gasloc_<version>_amd64.deb
#   scripts/package.sh BUILD_DIR [OUT_DIR]
# On each host: sudo apt-get install ./gasloc_<version>_amd64.deb (docs/communication.md).
# Needs the build dependencies (scripts/setup.sh) and Debian's LibTorch: the Depends are derived
# from the packages that own the libraries the program links.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-$build/package}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
sanitize=$(sed -n 's/^GASLOC_SANITIZE:STRING=//p' "$build/CMakeCache.txt")
if [ -n "$sanitize" ]; then
  echo "package: $build is a sanitizer build (GASLOC_SANITIZE=$sanitize); package a Release build, e.g. scripts/package.sh build" >&2
  exit 1
fi
# Only the program: the package holds nothing else that is built.
cmake --build "$build" -j"$(nproc)" --target gasloc
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/gasloc_*.deb
cpack --config "$build/CPackConfig.cmake" -G DEB -B "$out" >"$out/cpack.log" 2>&1 ||
  { cat "$out/cpack.log" >&2; echo "package: cpack failed (log above, $out/cpack.log)" >&2; exit 1; }
debs=("$out"/gasloc_*_amd64.deb)
[ -f "${debs[0]}" ] || { echo "package: cpack wrote no gasloc_*_amd64.deb into $out ($out/cpack.log)" >&2; exit 1; }
deb=${debs[0]}
contents=$(dpkg-deb -c "$deb")
for f in ./usr/bin/gasloc ./usr/share/gasloc/configs/research.toml ./usr/share/gasloc/experiments/e1_one_step.toml; do
  grep -q " $f\$" <<<"$contents" || { echo "package: $deb lacks $f" >&2; exit 1; }
done
scripts/check_deb_depends.sh "$deb" >"$out/check_deb_depends.log" 2>&1 ||
  { cat "$out/check_deb_depends.log" >&2; exit 1; }
grep '^Depends:' "$out/check_deb_depends.log"
echo "$deb"

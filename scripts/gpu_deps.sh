#!/usr/bin/env bash
# Packs the build dependencies a GPU machine without a package registry lacks into DIR, for
# scripts/gpu_check.sh (GASLOC_DEPS=DIR): the headers of toml++, CLI11, nlohmann-json, spdlog,
# fmt and SentencePiece from this machine's Debian packages (scripts/setup.sh installs
# them), and CMake package files that make each library header-only (fmt: FMT_HEADER_ONLY,
# spdlog: no SPDLOG_COMPILED_LIB, toml++: TOML_HEADER_ONLY=1). No shared library is carried:
# nothing then depends on this machine's glibc, libstdc++ or C++ ABI (pip's LibTorch may use
# the old one). SentencePiece's library is dlopen()ed only for SentencePiece datasets. Gloo's
# headers are not carried: Debian's are older than a LibTorch 2.x's Gloo (CMakeLists.txt builds
# without the Gloo backend where the LibTorch ships none).
# OpenSSL 3 (libcrypto, CMakeLists.txt's find_package(OpenSSL 3)) is the one exception: its
# headers go to DIR/openssl/include (with the per-architecture configuration.h and
# opensslconf.h merged in) and this machine's libcrypto.so.3 to DIR/openssl/carried, for a
# machine that has none; scripts/gpu_check.sh links the machine's own libcrypto.so.3 where
# ldconfig knows one (OpenSSL 3 keeps its ABI within 3.x) and the carried one only otherwise
# (it needs glibc 2.34 or newer).
#   scripts/gpu_deps.sh DIR      (about 10 MB)
set -euo pipefail
out=${1:?usage: scripts/gpu_deps.sh DIR}
mkdir -p "$out/include" "$out/lib/cmake"
for h in toml++ CLI nlohmann spdlog fmt sentencepiece_processor.h sentencepiece_trainer.h; do
  [ -e "/usr/include/$h" ] || { echo "gpu_deps: /usr/include/$h missing (scripts/setup.sh installs it)" >&2; exit 1; }
  cp -r "/usr/include/$h" "$out/include/"
done
# OpenSSL 3: headers (the arch-specific ones beside them) and libcrypto.so.3.
triple=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
arch_inc=/usr/include/$triple/openssl
for d in /usr/include/openssl "$arch_inc"; do
  [ -d "$d" ] || { echo "gpu_deps: $d missing (apt-get install libssl-dev)" >&2; exit 1; }
done
mkdir -p "$out/openssl/include/openssl" "$out/openssl/carried"
cp -r /usr/include/openssl/. "$arch_inc/." "$out/openssl/include/openssl/"
[ -f "$out/openssl/include/openssl/configuration.h" ] || { echo "gpu_deps: no openssl/configuration.h" >&2; exit 1; }
crypto=$(readlink -f "/usr/lib/$triple/libcrypto.so.3" 2>/dev/null || true)
[ -f "$crypto" ] || crypto=$(ldconfig -p | awk '/libcrypto\.so\.3 .*x86-64/ { print $NF; exit }')
[ -f "$crypto" ] || { echo "gpu_deps: libcrypto.so.3 not found" >&2; exit 1; }
cp "$crypto" "$out/openssl/carried/libcrypto.so.3"
echo "gpu_deps: OpenSSL $(sed -n 's/^# *define OPENSSL_FULL_VERSION_STR "\(.*\)"/\1/p' "$out/openssl/include/openssl/opensslv.h") headers, $crypto (needs $(objdump -T "$crypto" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1))"
shim() {  # name target definitions [link]
  mkdir -p "$out/lib/cmake/$1"
  cat >"$out/lib/cmake/$1/$1Config.cmake" <<EOF
# Written by scripts/gpu_deps.sh: $2, header-only, from the headers beside this folder.
get_filename_component(_gasloc_deps "\${CMAKE_CURRENT_LIST_DIR}/../../../include" ABSOLUTE)
if(NOT TARGET $2)
  add_library($2 INTERFACE IMPORTED)
  set_target_properties($2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_gasloc_deps}"
                        INTERFACE_COMPILE_DEFINITIONS "$3" INTERFACE_LINK_LIBRARIES "${4:-}")
endif()
set($1_FOUND TRUE)
EOF
}
shim fmt fmt::fmt "FMT_HEADER_ONLY=1"
shim spdlog spdlog::spdlog "SPDLOG_FMT_EXTERNAL;FMT_HEADER_ONLY=1" fmt::fmt
shim tomlplusplus tomlplusplus::tomlplusplus "TOML_HEADER_ONLY=1"
shim nlohmann_json nlohmann_json::nlohmann_json ""
shim CLI11 CLI11::CLI11 ""
du -sh "$out"

#include "gasloc/core/shipped_files.hpp"

#include <system_error>

namespace gasloc {
namespace fs = std::filesystem;

fs::path shipped_dir() {
  static const fs::path dir = [] {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec || exe.empty()) return fs::path();
    // P/bin/gasloc -> P/share/gasloc
    const fs::path share = exe.parent_path().parent_path() / "share" / "gasloc";
    return fs::is_directory(share, ec) ? share : fs::path();
  }();
  return dir;
}

std::string find_shipped(const std::string& path) {
  std::error_code ec;
  if (path.empty() || fs::path(path).is_absolute() || fs::exists(path, ec)) return path;
  const fs::path dir = shipped_dir();
  if (dir.empty()) return path;
  const fs::path candidate = dir / path;
  return fs::exists(candidate, ec) ? candidate.string() : path;
}

std::string shipped_hint() {
  const fs::path dir = shipped_dir();
  if (dir.empty()) return "relative paths are relative to the working directory";
  return "relative paths are looked up in the working directory, then in " + dir.string() +
         " (the installed configs/ and experiments/)";
}

}  // namespace gasloc

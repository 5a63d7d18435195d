// Where a test finds the build tree and the sources. Both are found at run time, not passed as
// compile definitions, so that no test's compile line names an absolute path: ccache then shares
// the test objects between checkouts (a CI clone, a helper's worktree).
#pragma once
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace gasloc::test_paths {

// The build directory: the test executables live at its top (CMAKE_BINARY_DIR).
inline std::filesystem::path binary_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}

// The source tree, as CMake wrote it into the build directory at configure time.
inline std::filesystem::path source_dir() {
  std::ifstream f(binary_dir() / "gasloc_source_dir.txt");
  std::string dir;
  if (!std::getline(f, dir) || dir.empty())
    throw std::runtime_error("gasloc_source_dir.txt is missing from " + binary_dir().string() + ": re-run cmake");
  return dir;
}

}  // namespace gasloc::test_paths

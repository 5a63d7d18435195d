// The files gasloc ships beside its program (configs/ and experiments/), found without a checkout.
// `cmake --install build --prefix P` (or the Debian package, P = /usr) puts the program in
// P/bin/gasloc and those files in P/share/gasloc/{configs,experiments}. A relative path that does
// not exist from the working directory, such as --config configs/research.toml or a study file's
// job = "configs/research.toml", is then looked up in P/share/gasloc, P found from the running
// program (/proc/self/exe). In a checkout, build/gasloc has no share/gasloc beside it, so paths
// mean what they always meant: relative to where gasloc runs.
#pragma once
#include <filesystem>
#include <string>

namespace gasloc {

// P/share/gasloc when the running program is P/bin/gasloc and that directory exists, else "".
std::filesystem::path shipped_dir();

// `path` itself when it is empty, absolute or exists from the working directory; else
// shipped_dir()/path when that exists; else `path` unchanged (the caller's error names it).
std::string find_shipped(const std::string& path);

// A hint's tail for a file that was not found: where relative paths are also looked up.
std::string shipped_hint();

}  // namespace gasloc

// Crash- and full-disk-safe file writes: write to PATH.tmp, fsync, rename over PATH. Either the
// new file is complete or the previous one is untouched.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

namespace gasloc {

// Writes `bytes` to `path` atomically. Throws gasloc::Error (with errno text) if any write,
// fsync or rename fails; the temporary file is removed and any previous `path` survives.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
// The same for a file that several processes may write at once (the same bytes: a run's
// run.json on one host): each writes through a temporary file of its own.
void write_file_atomic_shared(const std::filesystem::path& path, std::string_view bytes);

// Reads a whole file. Throws gasloc::Error naming the path if it cannot be opened or read, or is
// a directory.
std::string read_file(const std::filesystem::path& path);
// The same for a file that must be small (job files, JSON records): more than max_bytes is an
// error, found after reading max_bytes + 1 at most (/dev/zero or a huge file never fills memory).
std::string read_file(const std::filesystem::path& path, size_t max_bytes);

}  // namespace gasloc

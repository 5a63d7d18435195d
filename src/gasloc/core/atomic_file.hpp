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

// A descriptor of `path` open for reading (the caller closes it). Throws gasloc::Error naming the
// path if it cannot be opened or is not a regular file: a FIFO, socket or device is refused at
// once (it is opened without blocking), where reading it could wait forever.
int open_regular_file(const std::filesystem::path& path);
// Reads a whole regular file (open_regular_file's errors, or one naming the path if a read fails).
std::string read_file(const std::filesystem::path& path);
// The same for a file that must be small (job files, JSON records): more than max_bytes is an
// error, found after reading max_bytes + 1 at most (a huge file never fills memory).
std::string read_file(const std::filesystem::path& path, size_t max_bytes);

}  // namespace gasloc

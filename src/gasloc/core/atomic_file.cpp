#include "gasloc/core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <limits>

#include "gasloc/core/error.hpp"

namespace gasloc {
namespace fs = std::filesystem;

namespace {
// Closes the descriptor and removes the temporary file unless released.
struct TmpFile {
  int fd = -1;
  fs::path path;
  bool keep = false;
  ~TmpFile() {
    if (fd >= 0) ::close(fd);
    if (!keep) {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
};

[[noreturn]] void fail(const std::string& what, const fs::path& path, int err) {
  throw Error(what + " '" + path.string() + "': " + std::strerror(err),
              err == ENOSPC || err == EFBIG || err == EDQUOT
                  ? "free some disk space; the previous file (if any) was left intact"
                  : "check that the directory exists and is writable");
}
}  // namespace

namespace {
void write_through(const fs::path& path, std::string_view bytes, const std::string& tmp_suffix);
}  // namespace

void write_file_atomic(const fs::path& path, std::string_view bytes) { write_through(path, bytes, ".tmp"); }

void write_file_atomic_shared(const fs::path& path, std::string_view bytes) {
  write_through(path, bytes, ".tmp." + std::to_string(::getpid()));
}

namespace {
void write_through(const fs::path& path, std::string_view bytes, const std::string& tmp_suffix) {
  if (path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail("cannot create directory for", path, ec.value());
  }
  TmpFile tmp;
  tmp.path = path;
  tmp.path += tmp_suffix;
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0) fail("cannot create", tmp.path, errno);
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(tmp.fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", tmp.path, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(tmp.fd) != 0) fail("cannot sync", tmp.path, errno);
  if (::close(tmp.fd) != 0) {
    tmp.fd = -1;
    fail("cannot close", tmp.path, errno);
  }
  tmp.fd = -1;
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) fail("cannot rename onto", path, errno);
  tmp.keep = true;
}
}  // namespace

namespace {
// Reads what is left of `fd` (a regular file), up to `limit` bytes.
std::string read_rest(int fd, const fs::path& path, size_t limit) {
  std::string out;
  char buf[1 << 16];
  while (out.size() < limit) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, limit - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read", path, errno);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Closer {
  int fd;
  ~Closer() { ::close(fd); }
};
}  // namespace

int open_regular_file(const fs::path& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(e)),
                e == ENOENT ? "check that the file exists" : "check the path and its permissions");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    if (S_ISDIR(st.st_mode)) throw Error("'" + path.string() + "' is a directory, not a file", "give the path of a file");
    throw Error(fmt::format("'{}' is not a regular file (a FIFO, socket or device): reading it could wait forever",
                            path.string()),
                "give the path of a regular file");
  }
  return fd;
}

std::string read_file(const fs::path& path) {
  const Closer file{open_regular_file(path)};
  return read_rest(file.fd, path, std::numeric_limits<size_t>::max());
}

std::string read_file(const fs::path& path, size_t max_bytes) {
  const Closer file{open_regular_file(path)};
  std::string out = read_rest(file.fd, path, max_bytes + 1);
  if (out.size() > max_bytes)
    throw Error(fmt::format("'{}' is larger than {} bytes: not a file of this kind", path.string(), max_bytes),
                "check the path");
  return out;
}

}  // namespace gasloc

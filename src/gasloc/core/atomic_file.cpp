#include "gasloc/core/atomic_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

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

std::string read_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error("'" + path.string() + "' is a directory, not a file", "give the path of a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path.string() + "'", "check that the file exists");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error("cannot read '" + path.string() + "'");
  return ss.str();
}

std::string read_file(const fs::path& path, size_t max_bytes) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error("'" + path.string() + "' is a directory, not a file", "give the path of a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path.string() + "'", "check that the file exists");
  std::string out(max_bytes + 1, '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  if (in.bad()) throw Error("cannot read '" + path.string() + "'");
  out.resize(static_cast<size_t>(in.gcount()));
  if (out.size() > max_bytes)
    throw Error(fmt::format("'{}' is larger than {} bytes: not a file of this kind", path.string(), max_bytes),
                "check the path");
  return out;
}

}  // namespace gasloc

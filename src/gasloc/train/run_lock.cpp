#include "gasloc/train/run_lock.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gasloc/core/error.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

RunDirLock::RunDirLock(const fs::path& run_dir, const std::vector<int>& ranks) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path file = run_dir / ".lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw CheckpointError(fmt::format("cannot open the run directory's lock '{}': {}", file.string(), std::strerror(errno)),
                          "check that train.run_dir is writable");
  for (int r : ranks) {
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_start = r;
    l.l_len = 1;
    if (::fcntl(fd_, F_SETLK, &l) == 0) continue;
    const int err = errno;
    struct flock holder = l;
    const bool known = ::fcntl(fd_, F_GETLK, &holder) == 0 && holder.l_type != F_UNLCK;
    ::close(fd_);
    fd_ = -1;
    if (err != EACCES && err != EAGAIN)
      throw CheckpointError(fmt::format("cannot lock the run directory '{}': {}", run_dir.string(), std::strerror(err)));
    throw CheckpointError(
        fmt::format("run directory '{}' is in use: rank {}'s part is held by {}", run_dir.string(), r,
                    known ? fmt::format("process {}", holder.l_pid) : std::string("another process")),
        "another gasloc train (or a --resume) writes this run now: wait for it to end or stop it (kill -INT PID lets it "
        "checkpoint), or choose another train.run_dir");
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases every byte this process locked
}

}  // namespace gasloc::train

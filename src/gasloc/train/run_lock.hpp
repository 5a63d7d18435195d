// One run directory, one job: an advisory lock held for the run's life, so that two launches into
// one directory, or a --resume while the run still trains, are refused with the holder's pid
// instead of losing one run's metrics or killing the other at its next checkpoint.
//
// The lock is RUN/.lock with one byte per rank (POSIX record locks): an in-process job locks the
// bytes of all its ranks, a process rank the byte of its own rank, so the ranks of one job never
// refuse each other while a second job's rank r is refused. The kernel releases a lock when its
// process exits, killed or not: a lock of a dead process is never stale on a local file system.
// (Over NFS the server's lock manager decides; a rank started on another host with its own copy
// of the directory locks that copy.)
#pragma once
#include <filesystem>
#include <vector>

namespace gasloc::train {

class RunDirLock {
 public:
  // Creates the directory if needed and locks `ranks`' bytes. Throws CheckpointError naming the
  // directory, the rank and the holder's pid when another process holds one of them.
  RunDirLock(const std::filesystem::path& run_dir, const std::vector<int>& ranks);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace gasloc::train

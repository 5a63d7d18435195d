#include "rank_process.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gasloc/core/error.hpp"
#include "netns_testbed.hpp"

namespace gasloc::app {

namespace {
int g_signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  [[maybe_unused]] auto _ = ::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}
}  // namespace

std::string resolve(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return cmd;
  if (cmd == "gasloc") {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) return std::string(buf, static_cast<size_t>(n));
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string full = dir + "/" + cmd;
    if (::access(full.c_str(), X_OK) == 0) return full;
    start = end + 1;
  }
  throw Error(fmt::format("launch: command '{}' not found in PATH", cmd), "give its path, e.g. ./build/" + cmd);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  return "unknown status";
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }
int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Emits the complete lines in `buf` with the rank prefix; keeps a trailing partial line.
void emit_lines(Rank& r, std::string& buf, int to_fd, bool flush_partial) {
  size_t start = 0;
  std::string out;
  for (;;) {
    const size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = buf.substr(start, nl - start);
    out += fmt::format("[rank {}] {}\n", r.index, line);
    r.tail.push_back(std::move(line));
    if (r.tail.size() > kTailLines) r.tail.pop_front();
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush_partial && !buf.empty()) {
    out += fmt::format("[rank {}] {}\n", r.index, buf);
    r.tail.push_back(buf);
    if (r.tail.size() > kTailLines) r.tail.pop_front();
    buf.clear();
  }
  if (!out.empty()) write_all(to_fd, out);
}

// Reads what is available on one of a rank's pipes; closes it at end of file.
void drain(Rank& r, int& fd, std::string& buf, int to_fd) {
  char chunk[65536];
  const ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n > 0) {
    buf.append(chunk, static_cast<size_t>(n));
    emit_lines(r, buf, to_fd, false);
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    emit_lines(r, buf, to_fd, true);
    ::close(fd);
    fd = -1;
  }
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (auto& r : ranks)
    if (r.running) ::kill(-r.pid, sig);  // its process group: the rank and anything it started
}

// Starts rank i. Everything the child needs is prepared before fork(): between fork and exec
// only async-signal-safe calls are allowed.
Rank spawn_rank(const std::string& exe, std::vector<std::string> args, std::vector<std::string> env, NetnsTestbed* testbed,
                int i) {
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string exec_error = fmt::format("launch: cannot run {}: ", exe);
  const pid_t launcher = ::getpid();
  {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw Error("launch: pipe failed");
    // Signals stay blocked across fork() until the child has reset its handlers: a signal that
    // arrived in between would otherwise run the launcher's handler in the child and be
    // reported to the launcher through the inherited self-pipe.
    sigset_t all, saved;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &saved);
    const pid_t pid = ::fork();
    if (pid != 0) ::sigprocmask(SIG_SETMASK, &saved, nullptr);
    if (pid < 0) throw Error(fmt::format("launch: fork failed: {}", std::strerror(errno)));
    if (pid == 0) {
      // Child: own process group (signals come from the launcher only, once), dies with the
      // launcher, stdin from /dev/null, stdout/stderr into the launcher's pipes.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(127);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      if (testbed && ::setns(testbed->netns_fd(i), CLONE_NEWNET) != 0) {
        static const char msg[] = "launch: cannot enter the rank's network namespace\n";
        [[maybe_unused]] auto w0 = ::write(2, msg, sizeof msg - 1);
        ::_exit(127);
      }
      ::execve(exe.c_str(), argv.data(), envp.data());
      [[maybe_unused]] auto w1 = ::write(2, exec_error.data(), exec_error.size());
      const char* e = ::strerror(errno);
      [[maybe_unused]] auto w2 = ::write(2, e, std::strlen(e));
      [[maybe_unused]] auto w3 = ::write(2, "\n", 1);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also from the parent: no race with the first signal_all
    ::close(out[1]);
    ::close(err[1]);
    return Rank{i, pid, out[0], err[0], {}, {}, {}, true, 0};
  }
}

SignalCapture::SignalCapture() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("launch: pipe failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t k = 0; k < kSignals.size(); ++k) ::sigaction(kSignals[k], &sa, &old_[k]);  // SIGCHLD wakes poll()
}

SignalCapture::~SignalCapture() {
  for (size_t k = 0; k < kSignals.size(); ++k) ::sigaction(kSignals[k], &old_[k], nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
}

int SignalCapture::fd() { return g_signal_pipe[0]; }

}  // namespace gasloc::app

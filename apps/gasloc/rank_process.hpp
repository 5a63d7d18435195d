// The processes of `gasloc launch`'s ranks: starting one (fork/exec with its own process group,
// dying with the launcher), reading its output line by line with the [rank i] prefix while
// keeping its last lines, signalling them, and the launcher's own signals through a self-pipe.
#pragma once
#include <sys/types.h>

#include <array>
#include <csignal>
#include <deque>
#include <string>
#include <vector>

namespace gasloc::app {

class NetnsTestbed;

// Lines of a rank's output kept for the failure report.
constexpr size_t kTailLines = 20;

struct Rank {
  int index = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;  // read ends of its stdout and stderr pipes
  std::string out_partial, err_partial;
  std::deque<std::string> tail;  // last lines of output, both streams
  bool running = false;
  int status = 0;
};

// COMMAND as a path for execve: "gasloc" means this very binary (so the ranks run the same
// build as the launcher); a name without '/' is searched in PATH.
std::string resolve(const std::string& cmd);
// A waitpid status in words ("exit status 1", "signal 9 (Killed)").
std::string describe_status(int status);
bool failed(int status);
// The shell's convention: the exit status, or 128 + the signal.
int exit_code(int status);
void write_all(int fd, const std::string& s);

// Emits the complete lines in `buf` with the rank prefix; keeps a trailing partial line.
void emit_lines(Rank& r, std::string& buf, int to_fd, bool flush_partial);
// Reads what is available on one of a rank's pipes; closes it at end of file.
void drain(Rank& r, int& fd, std::string& buf, int to_fd);
// Signals every running rank's process group: the rank and anything it started.
void signal_all(std::vector<Rank>& ranks, int sig);

// Starts rank i (in the test bed's namespace of rank i when there is one).
Rank spawn_rank(const std::string& exe, std::vector<std::string> args, std::vector<std::string> env, NetnsTestbed* testbed,
                int i);

// Signals reach the supervision loop through the self-pipe for as long as this lives, so that no
// work happens in the handler.
class SignalCapture {
 public:
  SignalCapture();
  ~SignalCapture();
  SignalCapture(const SignalCapture&) = delete;
  SignalCapture& operator=(const SignalCapture&) = delete;
  // The read end of the self-pipe: one byte per signal caught (non-blocking).
  static int fd();

 private:
  // SIGUSR1: a status line (ranks alive, restarts left, the store's size).
  static constexpr std::array<int, 5> kSignals{SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1};
  std::array<struct sigaction, 5> old_{};
};

}  // namespace gasloc::app

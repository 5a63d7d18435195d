// `gasloc launch -n N -- COMMAND ARGS...`: starts N ranks of COMMAND on this host with the
// torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// prefixes their output with [rank i], forwards Ctrl+C/SIGTERM, and when one rank fails stops
// the others and says which rank failed, how, and what it printed last. Never leaves a rank
// behind: ranks also die with the launcher (PR_SET_PDEATHSIG).
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>

#include "commands.hpp"
#include "gasloc/comm/elastic_host.hpp"
#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/secret.hpp"
#include "gasloc/train/job_config.hpp"
#include "netns_testbed.hpp"

extern char** environ;

namespace gasloc::app {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kTailLines = 20;

// Signals reach the loop through a self-pipe, so that no work happens in the handler.
int g_signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  [[maybe_unused]] auto _ = ::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

// COMMAND as a path for execve: "gasloc" means this very binary (so the ranks run the same
// build as the launcher); a name without '/' is searched in PATH.
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

struct Rank {
  int index = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;  // read ends of its stdout and stderr pipes
  std::string out_partial, err_partial;
  std::deque<std::string> tail;  // last lines of output, both streams
  bool running = false;
  int status = 0;
};

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

struct Opts {
  int n = 0;
  int port = 0;
  std::string addr = "127.0.0.1";
  std::optional<double> timeout;  // unset: the command's own (gasloc train: cluster.timeout_s)
  double grace = 10;
  std::optional<double> heartbeat_timeout;  // 0: ranks are not judged; unset: the job's (elastic) or 30 s
  std::string bandwidth;
  std::string secret_file;  // the job's secret: the launcher's store and its ranks (by path) use it
  bool netns = false, keep = false, cleanup = false;
  bool elastic = false;  // a failed rank restarts and rejoins; the others go on
  int max_restarts = 3;  // restarts of failed ranks over the whole job
  int min_ranks = 1;     // fewer live ranks stop the job
  std::string netns_config;               // links of the test bed for a command that is not gasloc train
  std::vector<std::string> netns_set;
  std::vector<std::string> cmd;
};

// The run.json of the run that `gasloc train --resume DIR` continues (null without --resume).
nlohmann::json resumed_run(const Opts& o) {
  for (size_t i = 2; i + 1 < o.cmd.size(); ++i)
    if (o.cmd[i] == "--resume") {
      const std::string dir = o.cmd[i + 1];
      auto doc = nlohmann::json::parse(read_file(std::filesystem::path(dir) / "run.json"), nullptr, false);
      if (doc.is_discarded() || !doc.contains("config") || !doc.contains("world"))
        throw Error("launch: cannot read " + dir + "/run.json", "--resume needs the directory of a run gasloc train started");
      return doc;
    }
  return nullptr;
}

// The job that the `gasloc train` ranks will run: its --config/--set, or the run.json of --resume.
train::JobConfig train_job(const Opts& o) {
  std::string config;
  std::vector<std::string> sets;
  for (size_t i = 2; i + 1 < o.cmd.size(); ++i) {
    const std::string& a = o.cmd[i];
    if (a == "--config" || a == "-c") config = o.cmd[++i];
    else if (a == "--set" || a == "-s") sets.push_back(o.cmd[++i]);
  }
  const nlohmann::json resumed = resumed_run(o);
  return resumed.is_null() ? train::load_job(config, sets) : train::job_from_json(resumed["config"], sets);
}

// The links of the test bed: the [network] section of the job that `gasloc train` will run, else
// --netns-config/--netns-set, else defaults.
std::vector<double> testbed_links(const Opts& o, bool self_train) {
  train::JobConfig job = self_train ? train_job(o) : train::load_job(o.netns_config, o.netns_set);
  job.network.validate(o.n);
  const comm::NetworkModel links = job.network.model(o.n);
  std::vector<double> bw;
  for (int r = 0; r < o.n; ++r) bw.push_back(links.bandwidth(r));
  return bw;
}

// Every option checked before anything starts: a bad one used to be ignored (--timeout 0 or -5)
// or wrapped around (--master-port 70000 gave the ranks port 4464).
void validate(const Opts& o) {
  if (o.n < 1 || o.n > 4096) throw Error(fmt::format("launch: -n {} is outside 1..4096", o.n));
  if (o.port < 0 || o.port > 65535)
    throw Error(fmt::format("launch: --master-port {} is outside 0..65535", o.port), "0 (the default) picks a free port");
  if (o.timeout && !(*o.timeout > 0 && *o.timeout <= train::kMaxTimeoutS))
    throw Error(fmt::format("launch: --timeout {} must be a positive number of seconds, at most {:.0f} (a week)", *o.timeout,
                            train::kMaxTimeoutS),
                "leave it out to use the command's own (gasloc train: cluster.timeout_s, 300 s)");
  if (!(o.grace >= 0 && std::isfinite(o.grace)))
    throw Error(fmt::format("launch: --grace {} must be a number of seconds >= 0", o.grace));
  if (o.heartbeat_timeout) comm::check_heartbeat_timeout(*o.heartbeat_timeout, "launch: --heartbeat-timeout", true);
  if (o.addr.empty()) throw Error("launch: --master-addr is empty", "the default 127.0.0.1 serves ranks on this host");
  if (o.max_restarts < 0) throw Error(fmt::format("launch: --max-restarts {} must be >= 0", o.max_restarts));
  if (o.min_ranks < 1 || o.min_ranks > o.n)
    throw Error(fmt::format("launch: --min-ranks {} is outside 1..{} (-n)", o.min_ranks, o.n),
                "the job stops when fewer ranks than --min-ranks are alive; it cannot ask for more than it starts");
}

// The ranks' command line: gasloc's own commands get the job's token and --timeout /
// --bandwidth-limit as their arguments (gasloc reads no variable of its own); another command
// gets its settings from the user.
std::vector<std::string> rank_args(const Opts& o, bool self_cmd, bool gasloc_ranks, const std::string& job_token) {
  std::vector<std::string> args = o.cmd;
  if (gasloc_ranks) args.insert(args.begin() + 2, {"--job-id", job_token});
  // The secret's path, never its content: a command line is visible to every user of the host.
  if (gasloc_ranks && !o.secret_file.empty()) {
    const std::string path = std::filesystem::absolute(o.secret_file).string();
    if (args[1] == "train") args.insert(args.begin() + 2, {"--set", "cluster.secret_file=" + path});
    else args.insert(args.begin() + 2, {"--secret-file", path});
  }
  if (self_cmd && args[1] == "train") {
    if (o.elastic) args.insert(args.begin() + 2, {"--set", "cluster.elastic=true"});
    if (o.timeout) args.insert(args.begin() + 2, {"--set", fmt::format("cluster.timeout_s={}", *o.timeout)});
    if (!o.bandwidth.empty())
      throw Error("launch: --bandwidth-limit does not apply to gasloc train",
                  "describe the links in the job's [network] section and set network.throttle_gloo = true");
  } else if (self_cmd && args[1] == "comm-check") {
    if (o.timeout) args.insert(args.begin() + 2, {"--timeout", fmt::format("{}", *o.timeout)});
    if (!o.bandwidth.empty()) args.insert(args.begin() + 2, {"--bandwidth-limit", o.bandwidth});
  } else if (o.timeout || !o.bandwidth.empty()) {
    throw Error("launch: --timeout and --bandwidth-limit apply to gasloc train and gasloc comm-check only",
                "give the command its own timeout setting");
  }
  return args;
}

// Each rank's environment: the launcher's, with the torchrun variables set for that rank.
std::vector<std::vector<std::string>> rank_envs(int n, const std::string& master_addr, int port, bool testbed) {
  std::vector<std::string> base;
  auto overridden = [testbed](const std::string& kv) {
    for (const char* k : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                          "TORCHELASTIC_USE_AGENT_STORE=", "TORCHELASTIC_RESTART_COUNT="})
      if (kv.rfind(k, 0) == 0) return true;
    return testbed && kv.rfind("GLOO_SOCKET_IFNAME=", 0) == 0;
  };
  for (char** e = environ; *e != nullptr; ++e)
    if (!overridden(*e)) base.emplace_back(*e);
  base.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
  base.push_back("TORCHELASTIC_RESTART_COUNT=0");  // torch.distributed's env:// needs it with an agent store
  if (testbed) base.push_back("GLOO_SOCKET_IFNAME=eth0");  // Gloo's data connections on the host's own interface
  std::vector<std::vector<std::string>> envs(n, base);
  for (int i = 0; i < n; ++i)
    for (auto kv : {fmt::format("RANK={}", i), fmt::format("WORLD_SIZE={}", n), fmt::format("LOCAL_RANK={}", i),
                    fmt::format("LOCAL_WORLD_SIZE={}", n), "MASTER_ADDR=" + master_addr, fmt::format("MASTER_PORT={}", port)})
      envs[i].push_back(kv);
  return envs;
}

// Signals reach the supervision loop through the self-pipe for as long as this lives.
class SignalCapture {
 public:
  SignalCapture() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("launch: pipe failed");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t k = 0; k < kSignals.size(); ++k) ::sigaction(kSignals[k], &sa, &old_[k]);  // SIGCHLD wakes poll()
  }
  ~SignalCapture() {
    for (size_t k = 0; k < kSignals.size(); ++k) ::sigaction(kSignals[k], &old_[k], nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }
  SignalCapture(const SignalCapture&) = delete;
  SignalCapture& operator=(const SignalCapture&) = delete;

 private:
  // SIGUSR1: a status line (ranks alive, restarts left, the store's size).
  static constexpr std::array<int, 5> kSignals{SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1};
  std::array<struct sigaction, 5> old_{};
};

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

// The arguments of incarnation `inc` of a rank of an elastic run (gasloc train --incarnation).
std::vector<std::string> with_incarnation(std::vector<std::string> args, int64_t inc) {
  args.insert(args.begin() + 2, {"--incarnation", std::to_string(inc)});
  return args;
}

Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Starts incarnation inc of rank id (elastic restarts).
using Spawn = std::function<Rank(int id, int64_t inc)>;

// Watches the ranks until all have exited and their output is read: forwards signals, stops
// every rank when one fails, and records each failure in the store. Elastic, the policy is the
// library's (comm::ElasticHost: roster, heartbeats, fencing, restarts, --min-ranks); this is its
// process control, the plumbing of fork/exec (spawn), kill and waitpid.
class Supervisor : public comm::ProcessControl {
 public:
  // Elastic, the host writes the roster here, before the caller starts the ranks into `ranks`.
  Supervisor(std::vector<Rank>& ranks, c10d::Store& store, int world, double grace, double heartbeat_timeout,
             std::optional<comm::ElasticHost::Options> elastic = {}, Spawn spawn = {})
      : ranks_(ranks), store_(store), grace_(grace), t_start_(Clock::now()),
        heartbeats_(world, heartbeat_timeout),
        judge_heartbeats_(heartbeat_timeout > 0 && !elastic), spawn_(std::move(spawn)) {
    if (elastic) {
      elastic->heartbeat_timeout_s = heartbeat_timeout;
      elastic_.emplace(store, *elastic, this);
    }
  }
  int first_failed = -1;  // the entry of `ranks` whose failure stopped the job
  bool interrupted = false;
  double interrupted_at_ = 0;  // seconds(); a repeat within a second is the same request, delivered twice
  const comm::ElasticHost* elastic() const { return elastic_ ? &*elastic_ : nullptr; }

  // comm::ProcessControl, for the elastic host.
  std::string name() const override { return "gasloc launch"; }
  void start(int id, int64_t inc) override { ranks_.push_back(spawn_(id, inc)); }
  void kill(int id, const std::string& why) override {
    for (auto& r : ranks_) {
      if (!r.running || r.index != id) continue;
      killed_why_[r.pid] = why;
      ::kill(-r.pid, SIGKILL);
      ::kill(-r.pid, SIGCONT);  // a stopped process group dies at once
    }
  }

  void run() {
    for (;;) {
      pump_output();
      handle_signals();
      reap();
      check_heartbeats();
      if (elastic_) tend_roster();
      if (kill_at_ && Clock::now() >= *kill_at_) {
        if (any_running()) write_all(2, fmt::format("launch: ranks still running {:g} s after SIGTERM; killing them\n", grace_));
        signal_all(ranks_, SIGKILL);
        kill_at_.reset();
      }
      if (finished()) return;
    }
  }

 private:
  bool any_running() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
  }

  void pump_output() {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Rank*, int>> owner{{nullptr, 0}};
    for (auto& r : ranks_) {
      if (r.out_fd >= 0) fds.push_back({r.out_fd, POLLIN, 0}), owner.emplace_back(&r, 1);
      if (r.err_fd >= 0) fds.push_back({r.err_fd, POLLIN, 0}), owner.emplace_back(&r, 2);
    }
    ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& r = *owner[k].first;
      if (owner[k].second == 1) drain(r, r.out_fd, r.out_partial, 1);
      else drain(r, r.err_fd, r.err_partial, 2);
    }
  }

  void handle_signals() {
    char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) == 1) {
      if (sig == SIGCHLD) continue;
      if (sig == SIGUSR1) {
        print_status();
        continue;
      }
      // A terminal's Ctrl+C, or `timeout` signalling its child and then its group, can deliver
      // one request twice within microseconds; only a later one is a second request.
      if (interrupted && seconds() - interrupted_at_ < 1.0) continue;
      if (sig == SIGINT && interrupted) {
        write_all(2, "launch: second interrupt: killing every rank\n");
        signal_all(ranks_, SIGKILL);
        continue;
      }
      interrupted = true;
      interrupted_at_ = seconds();
      if (elastic_) elastic_->interrupt();
      write_all(2, fmt::format("launch: got {}; forwarding it to every rank\n", ::strsignal(sig)));
      signal_all(ranks_, sig == SIGHUP ? SIGTERM : sig);
      // Ctrl+C lets the ranks checkpoint for as long as they need (a second Ctrl+C kills);
      // SIGTERM (e.g. from a scheduler) gets the grace period.
      if (sig != SIGINT && !kill_at_) kill_at_ = after_seconds(grace_);
    }
  }

  double seconds() const { return std::chrono::duration<double>(Clock::now() - t_start_).count(); }

  // `kill -USR1` of the launcher: who runs, what is left, and how large the store has grown.
  void print_status() {
    std::vector<int> running;
    for (const auto& r : ranks_)
      if (r.running) running.push_back(r.index);
    std::sort(running.begin(), running.end());
    std::string rss = "?";
    std::ifstream proc("/proc/self/status");
    for (std::string line; std::getline(proc, line);)
      if (line.rfind("VmRSS:", 0) == 0) rss = fmt::format("{:.1f} MB", std::strtod(line.c_str() + 6, nullptr) / 1024);
    int64_t keys = -1;
    try {
      keys = store_.getNumKeys();
    } catch (const std::exception&) {
    }
    write_all(2, fmt::format("launch: status at {:.1f} s: rank(s) {} running{}; store: {} keys; launcher RSS {}\n",
                             seconds(), fmt::join(running, ", "),
                             elastic_ ? fmt::format("; {} restart(s) left", elastic_->restarts_left()) : "", keys, rss));
  }

  void reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (size_t k = 0; k < ranks_.size(); ++k) {
        Rank& r = ranks_[k];
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        r.status = status;
        if (elastic_) {
          elastic_exit(k);
          break;
        }
        if (!failed(status) || interrupted) continue;
        // A rank's own record, written before it exited, wins over this one.
        comm::publish_failure(store_, r.index,
                              {r.index, fmt::format("rank {} exited with {} (seen by gasloc launch)", r.index,
                                                    describe_status(status))});
        if (first_failed >= 0) continue;
        first_failed = static_cast<int>(k);
        write_all(2, fmt::format("launch: rank {} failed with {} after {:.1f} s; stopping the other ranks\n", r.index,
                                 describe_status(status), seconds()));
        stop_all();
      }
    }
  }

  void stop_all() {
    signal_all(ranks_, SIGTERM);
    kill_at_ = after_seconds(grace_);
  }

  // How a rank's process ended, in words, with the launcher's own reason when it killed it.
  std::string ending(const Rank& r) const {
    if (const auto it = killed_why_.find(r.pid); it != killed_why_.end())
      return describe_status(r.status) + ", sent by gasloc launch: " + it->second;
    return describe_status(r.status);
  }

  // Stops the job because of rank entry k, saying why.
  void stop_job(size_t k, const std::string& why) {
    write_all(2, "launch: " + why + "\n");
    first_failed = static_cast<int>(k);
    stop_all();
  }

  // Elastic: the host decides what an exit means (the roster, a restart, the end of the job).
  // ranks_ may grow inside (a restart), so rank k is named by its index only.
  void elastic_exit(size_t k) {
    const int status = ranks_[k].status;
    const comm::ProcessEnd end{WIFEXITED(status) ? std::optional<int>(WEXITSTATUS(status)) : std::nullopt,
                               describe_status(status), ending(ranks_[k])};
    act(elastic_->exited(ranks_[k].index, end, seconds()), k);
  }

  // Announcements, peers' reports and heartbeats, judged by the host.
  void tend_roster() { act(elastic_->tend(seconds()), std::nullopt); }

  // Prints what the host did; stops every rank when it says the job cannot go on (caused by rank
  // entry k: the one whose failure the summary reports).
  void act(const std::vector<comm::HostEvent>& events, std::optional<size_t> k) {
    for (const auto& e : events) {
      if (e.kind != comm::HostEvent::Kind::stop) {
        write_all(2, "launch: " + e.line + "\n");
      } else if (k) {
        stop_job(*k, e.line);
      }  // tend() never stops the job: only an exit does (k set)
    }
  }

  // Without --elastic (elastic: the host judges). A running rank whose heartbeat stalled is
  // stopped, frozen or cut off: its peers would wait for it until cluster.timeout_s. Killing it
  // makes it a failure like any other, named now, which stops the job. Judged five times a second (so a hang is named within 0.2 s of its timeout plus a beat's
  // interval), while the job runs normally (not while it stops).
  void check_heartbeats() {
    if (!judge_heartbeats_ || interrupted || first_failed >= 0) return;
    const double now = std::chrono::duration<double>(Clock::now() - t_start_).count();
    if (now < next_heartbeat_check_) return;
    next_heartbeat_check_ = now + 0.2;
    for (int r : heartbeats_.stalled(store_, now)) {
      // The newest incarnation of rank r.
      auto it = std::find_if(ranks_.rbegin(), ranks_.rend(), [r](const Rank& x) { return x.index == r; });
      if (it == ranks_.rend() || !it->running) continue;
      const std::string what = fmt::format("rank {} sent no heartbeat for {:g} s (stopped, frozen or cut off from the store); "
                                           "gasloc launch killed it",
                                           r, heartbeats_.timeout_s());
      comm::publish_failure(store_, r, {r, what});
      write_all(2, "launch: " + what + "\n");
      kill(r, fmt::format("no heartbeat for {:g} s", heartbeats_.timeout_s()));
    }
  }

  // True when every rank has exited and its output is read. A process a rank started may keep a
  // pipe open after every rank exited: read what is there for a moment, then stop listening.
  bool finished() {
    const bool open = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.out_fd >= 0 || r.err_fd >= 0; });
    if (any_running()) return false;
    if (!open) return true;
    if (!drain_until_) drain_until_ = Clock::now() + std::chrono::seconds(1);
    if (Clock::now() < *drain_until_) return false;
    for (auto& r : ranks_) {
      for (int* fd : {&r.out_fd, &r.err_fd})
        if (*fd >= 0) ::close(*fd), *fd = -1;
      emit_lines(r, r.out_partial, 1, true);
      emit_lines(r, r.err_partial, 2, true);
    }
    return true;
  }

  std::vector<Rank>& ranks_;
  c10d::Store& store_;
  double grace_;
  Clock::time_point t_start_;
  std::map<pid_t, std::string> killed_why_;  // processes the launcher killed, and why
  std::optional<Clock::time_point> kill_at_;  // SIGKILL whoever is left at this time
  std::optional<Clock::time_point> drain_until_;
  comm::HeartbeatWatch heartbeats_;  // without --elastic (elastic: the host's)
  bool judge_heartbeats_;
  double next_heartbeat_check_ = 0;
  Spawn spawn_;
  std::optional<comm::ElasticHost> elastic_;
};

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// The failed rank's last lines, the other ranks' ends, and the rank its record blames first.
int report_failure(const std::vector<Rank>& ranks, int first_failed, c10d::Store& store, int world) {
  const Rank& f = ranks[first_failed];
  std::string msg = fmt::format("launch: rank {} of {} failed with {}. {}\n", f.index, world, describe_status(f.status),
                                f.tail.empty() ? "It printed nothing." : fmt::format("Its last {} lines:", f.tail.size()));
  for (const auto& line : f.tail) msg += "  | " + line + "\n";
  // The others: one line each, plus the last lines of those that exited on their own (not
  // by our signal): their errors say what they saw, and when two ranks failed at the same
  // moment the launcher cannot tell which came first.
  for (const auto& r : ranks) {
    if (&r == &f || !failed(r.status)) continue;
    msg += fmt::format("launch: rank {} ended with {}{}\n", r.index, describe_status(r.status),
                       WIFEXITED(r.status) && !r.tail.empty() ? "; its last lines:" : "");
    if (!WIFEXITED(r.status)) continue;
    for (size_t k = r.tail.size() > 5 ? r.tail.size() - 5 : 0; k < r.tail.size(); ++k) msg += "  | " + r.tail[k] + "\n";
  }
  // The first rank to exit may have failed because of another one (a stuck rank makes its peers
  // time out first): its record in the store names the rank that failed first.
  if (const auto rec = comm::read_failure(store, f.index); rec && rec->root >= 0 && rec->root != f.index)
    msg += fmt::format("launch: rank {} reports that rank {} failed first: {}\n", f.index, rec->root, rec->what);
  write_all(2, msg);
  return exit_code(f.status);
}

// Over processes the world is the number of ranks: a job file written for the in-process cluster
// with another cluster.workers would silently run another experiment, so the launcher says which wins.
void say_world(const Opts& o) {
  const int64_t workers = train_job(o).cluster.workers;
  if (workers == o.n || workers == train::JobConfig{}.cluster.workers) return;  // the default says nothing
  write_all(1, fmt::format("launch: {} ranks (-n {}) run this job; its cluster.workers = {} counts the in-process "
                           "cluster's workers only, so this is a run of {} workers, not {}\n",
                           o.n, o.n, workers, o.n, workers));
}

// The heartbeat timeout: --heartbeat-timeout, else an elastic job's cluster.heartbeat_timeout_s
// (one setting for the in-process reference and the real job), else 30 s.
double heartbeat_timeout(const Opts& o) {
  if (o.heartbeat_timeout) return *o.heartbeat_timeout;
  if (!o.elastic) return 30;
  const double s = train_job(o).cluster.heartbeat_timeout_s;
  comm::check_heartbeat_timeout(s, "launch: the job's cluster.heartbeat_timeout_s");
  write_all(1, fmt::format("launch: a rank without a heartbeat for {:g} s is killed and restarts (cluster.heartbeat_timeout_s; "
                           "--heartbeat-timeout overrides it)\n",
                           s));
  return s;
}

// An elastic job's end: one line per rank saying what each of its incarnations did, then the
// exit status: 0 only when every rank's newest incarnation ended well (finished, or found the
// job finished), 130 after an interrupt, the stopping rank's status when the job was stopped,
// else 1.
int elastic_outcome(const comm::ElasticHost& e, const Supervisor& s, const std::vector<Rank>& ranks, c10d::Store& store,
                    int world) {
  const int code = s.first_failed >= 0 ? report_failure(ranks, s.first_failed, store, world) : 0;
  std::vector<int> unfinished;
  for (int id = 0; id < world; ++id) {
    write_all(2, fmt::format("launch: rank {}: {}\n", id, e.story(id).empty() ? "never ended" : fmt::format("{}", fmt::join(e.story(id), "; "))));
    if (!e.ended_well(id)) unfinished.push_back(id);
  }
  if (code != 0) return code;
  if (s.interrupted) {
    write_all(2, "launch: the job stopped as asked (interrupted); resume it with gasloc train --resume RUN\n");
    return 130;
  }
  if (!unfinished.empty()) {
    write_all(2, fmt::format("launch: the job did not finish: rank(s) {} ended with an error (above)\n", fmt::join(unfinished, ", ")));
    return 1;
  }
  write_all(2, "launch: the job finished: every rank ended well\n");
  return 0;
}

int run_launch(const Opts& o) {
  if (o.cleanup) {
    const int removed = NetnsTestbed::cleanup_leftovers();
    fmt::print("launch --cleanup: removed {} namespace(s), bridge(s) and cable(s) of earlier test beds\n", removed);
    return 0;
  }
  validate(o);
  if (o.cmd.empty()) throw Error("launch: no command given", "usage: gasloc launch -n N -- COMMAND ARGS...");
  const std::string exe = resolve(o.cmd[0]);
  std::error_code ec;
  const bool self_cmd = o.cmd.size() >= 2 && std::filesystem::equivalent(exe, resolve("gasloc"), ec);
  // --netns: every rank its own host on a private bridge with shaped links; the launcher, on the
  // bridge's address, hosts the store.
  std::unique_ptr<NetnsTestbed> testbed;
  if (o.netns) {
    testbed = std::make_unique<NetnsTestbed>(testbed_links(o, self_cmd && o.cmd[1] == "train"), o.keep);
    write_all(1, testbed->describe());
  }
  const std::string master_addr = testbed ? testbed->bridge_address() : o.addr;
  // The launcher hosts the rendezvous store, so it outlives any rank: survivors can still read
  // there which rank failed first, and the launcher records the ranks it sees exit (without a
  // socket: nothing here waits on it). Port 0 lets the OS choose a free port, with no race.
  // gasloc's own commands meet at gasloc's store (bounded calls, one job per store) with the
  // job's token; another command (a torchrun-style script) gets c10d's TCPStore.
  const bool gasloc_ranks = self_cmd && (o.cmd[1] == "train" || o.cmd[1] == "comm-check");
  comm::JobIdentity job{comm::random_job_token(), fmt::format("gasloc launch pid {}", ::getpid()), {}};
  if (!o.secret_file.empty()) job.secret = read_secret_file(o.secret_file);
  comm::StoreHost store_host(master_addr, o.port, std::max(60.0, o.timeout.value_or(0)), job, !gasloc_ranks);
  std::vector<std::string> args = rank_args(o, self_cmd, gasloc_ranks, job.token);
  auto envs = rank_envs(o.n, master_addr, store_host.port(), testbed != nullptr);

  if (o.elastic && !(self_cmd && o.cmd[1] == "train"))
    throw Error("launch --elastic runs gasloc train ranks only", "e.g. gasloc launch --elastic -n 4 -- gasloc train --config JOB");
  if (self_cmd && o.cmd[1] == "train") say_world(o);
  const SignalCapture signals;
  // A run resumed on more ranks than saved it: those beyond start as joiners, with a donor's state.
  int founders = o.n;
  if (o.elastic)
    if (const auto resumed = resumed_run(o); !resumed.is_null() && resumed["world"].is_number_integer())
      founders = std::min(o.n, resumed["world"].get<int>());
  auto elastic_args = [&](int id, int64_t inc) {
    auto a = with_incarnation(args, inc);
    if (id >= founders && inc == 0) a.insert(a.begin() + 2, {"--set", "cluster.join=true"});
    return a;
  };
  std::optional<comm::ElasticHost::Options> elastic;
  if (o.elastic) {
    elastic = comm::ElasticHost::Options{o.n, founders, o.max_restarts, o.min_ranks, 0};
    if (founders < o.n)
      write_all(1, fmt::format("launch: the run was saved by {} ranks; ranks {}..{} join it with a donor's state\n",
                               founders, founders, o.n - 1));
  }
  std::vector<Rank> ranks;
  Supervisor supervisor(ranks, store_host.store(), o.n, o.grace, gasloc_ranks ? heartbeat_timeout(o) : 0.0, elastic,
                        [&](int id, int64_t inc) {
                          return spawn_rank(exe, elastic_args(id, inc), envs[id], testbed.get(), id);
                        });
  for (int i = 0; i < o.n; ++i)
    ranks.push_back(spawn_rank(exe, o.elastic ? elastic_args(i, 0) : args, envs[i], testbed.get(), i));
  supervisor.run();
  if (o.elastic) return elastic_outcome(*supervisor.elastic(), supervisor, ranks, store_host.store(), o.n);
  if (supervisor.first_failed >= 0) return report_failure(ranks, supervisor.first_failed, store_host.store(), o.n);
  if (supervisor.interrupted) {
    for (const auto& r : ranks)
      if (failed(r.status)) return exit_code(r.status);
    return 130;
  }
  return 0;
}

}  // namespace

Action add_launch(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  app.add_option("-n,--nproc", o->n, "number of ranks (processes) to start on this host");
  app.add_option("--master-port", o->port, "port of the rendezvous store that the launcher hosts (default: a free one)");
  app.add_option("--master-addr", o->addr, "address of rank 0 as the ranks reach it")->capture_default_str();
  app.add_option("--timeout", o->timeout,
                 "communication timeout of the ranks in seconds (gasloc train: sets cluster.timeout_s; comm-check: --timeout)");
  app.add_option("--bandwidth-limit", o->bandwidth,
                 "comm-check: throttle the ranks' links: BYTES_PER_S for all, or RANK=BYTES_PER_S,...");
  app.add_option("--secret-file", o->secret_file,
                 "the job's secret (gasloc secret --out FILE): the launcher's store serves only its holders, and "
                 "gasloc train / comm-check ranks get the file's path (cluster.secret_file)");
  app.add_option("--grace", o->grace, "seconds between SIGTERM and SIGKILL when stopping ranks")->capture_default_str();
  app.add_option("--heartbeat-timeout", o->heartbeat_timeout,
                 "seconds without a heartbeat after which a gasloc rank counts as hung and is killed, which stops the job "
                 "naming it (0 = off)")
      ->capture_default_str();
  auto* elastic = app.add_flag("--elastic", o->elastic,
               "gasloc train ranks with cluster.elastic: a rank that dies leaves the others training, and restarts "
               "and rejoins (up to --max-restarts); the launcher keeps the roster of ranks in its store");
  // Without --elastic a failed rank stops every rank: these would be silently ignored.
  app.add_option("--max-restarts", o->max_restarts, "with --elastic: restarts of failed ranks over the whole job")
      ->capture_default_str()
      ->needs(elastic);
  app.add_option("--min-ranks", o->min_ranks, "with --elastic: the job stops when fewer ranks than this are alive")
      ->capture_default_str()
      ->needs(elastic);
  app.add_flag("--netns", o->netns,
               "run every rank in its own network namespace on a private bridge, its links shaped with tbf as the job's "
               "[network] section says (root)");
  app.add_flag("--keep", o->keep, "with --netns: leave the namespaces and the bridge in place after the run");
  app.add_flag("--cleanup", o->cleanup, "remove the namespaces and bridges that earlier --netns launches left, then exit");
  app.add_option("--netns-config", o->netns_config, "with --netns, for a command that is not gasloc train: a job file whose [network] section shapes the links");
  app.add_option("--netns-set", o->netns_set, "with --netns: override a setting of those links, e.g. network.preset=straggler_bw10");
  app.add_option("command", o->cmd, "the command every rank runs, after --");
  app.footer("example: gasloc launch -n 4 -- gasloc comm-check");
  return [o]() {
    if (!o->cleanup && (o->n < 1 || o->cmd.empty()))
      throw Error("launch: give -n N and a command", "usage: gasloc launch -n N [--netns] -- COMMAND ARGS...");
    return run_launch(*o);
  };
}

}  // namespace gasloc::app

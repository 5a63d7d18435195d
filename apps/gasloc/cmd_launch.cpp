// `gasloc launch -n N -- COMMAND ARGS...`: starts N ranks of COMMAND on this host with the
// torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// prefixes their output with [rank i], forwards Ctrl+C/SIGTERM, and when one rank fails stops
// the others and says which rank failed, how, and what it printed last. Never leaves a rank
// behind: ranks also die with the launcher (PR_SET_PDEATHSIG).
// This file is the process plumbing (the loop over pipes, signals, waitpid and kills). What an
// exit or a stalled heartbeat means is comm::ElasticHost's (a fixed world is that host with zero
// restarts and min-ranks = n); the ranks' processes are rank_process.hpp, their command lines
// launch_job.hpp, the final report launch_outcome.hpp.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>

#include "commands.hpp"
#include "gasloc/comm/elastic_host.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/secret.hpp"
#include "launch_job.hpp"
#include "launch_outcome.hpp"
#include "netns_testbed.hpp"
#include "rank_process.hpp"

namespace gasloc::app {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Starts incarnation inc of rank id (elastic restarts).
using Spawn = std::function<Rank(int id, int64_t inc)>;

// Watches the ranks until all have exited and their output is read: forwards signals, and tells
// the host (comm::ElasticHost: roster, heartbeats, fencing, restarts, the floor of the job) what
// it saw; the host's answers are the policy, this is its process control: the plumbing of
// fork/exec (spawn), kill and waitpid.
class Supervisor : public comm::ProcessControl {
 public:
  // The host writes the roster here, before the caller starts the ranks into `ranks`.
  Supervisor(std::vector<Rank>& ranks, c10d::Store& store, comm::ElasticHost::Options policy, bool elastic, double grace,
             Spawn spawn)
      : ranks_(ranks), store_(store), grace_(grace), t_start_(Clock::now()), spawn_(std::move(spawn)),
        elastic_(elastic), host_(store, policy, this) {}
  Supervised outcome;
  double interrupted_at_ = 0;  // seconds(); a repeat within a second is the same request, delivered twice
  const comm::ElasticHost& host() const { return host_; }

  // comm::ProcessControl, for the host.
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
      act(host_.tend(seconds()), std::nullopt);  // announcements, peers' reports and heartbeats
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
    std::vector<pollfd> fds{{SignalCapture::fd(), POLLIN, 0}};
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
    while (::read(SignalCapture::fd(), &sig, 1) == 1) {
      if (sig == SIGCHLD) continue;
      if (sig == SIGUSR1) {
        print_status();
        continue;
      }
      // A terminal's Ctrl+C, or `timeout` signalling its child and then its group, can deliver
      // one request twice within microseconds; only a later one is a second request.
      if (outcome.interrupted && seconds() - interrupted_at_ < 1.0) continue;
      if (sig == SIGINT && outcome.interrupted) {
        write_all(2, "launch: second interrupt: killing every rank\n");
        signal_all(ranks_, SIGKILL);
        continue;
      }
      outcome.interrupted = true;
      interrupted_at_ = seconds();
      host_.interrupt();
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
                             elastic_ ? fmt::format("; {} restart(s) left", host_.restarts_left()) : "", keys, rss));
  }

  // Every exit goes to the host, which decides what it means (the end of a fixed world, a
  // restart, the floor of an elastic job). ranks_ may grow inside (a restart), so the entry is
  // named by its position only.
  void reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (size_t k = 0; k < ranks_.size(); ++k) {
        if (ranks_[k].pid != pid || !ranks_[k].running) continue;
        ranks_[k].running = false;
        ranks_[k].status = status;
        const comm::ProcessEnd end{WIFEXITED(status) ? std::optional<int>(WEXITSTATUS(status)) : std::nullopt,
                                   describe_status(status), ending(ranks_[k])};
        act(host_.exited(ranks_[k].index, end, seconds()), k);
        break;
      }
    }
  }

  // How a rank's process ended, in words, with the launcher's own reason when it killed it.
  std::string ending(const Rank& r) const {
    if (const auto it = killed_why_.find(r.pid); it != killed_why_.end())
      return describe_status(r.status) + ", sent by gasloc launch: " + it->second;
    return describe_status(r.status);
  }

  // Prints what the host did; stops every rank when it says the job cannot go on (caused by rank
  // entry k: the one whose failure the summary reports).
  void act(const std::vector<comm::HostEvent>& events, std::optional<size_t> k) {
    for (const auto& e : events) {
      write_all(2, "launch: " + e.line + "\n");
      if (e.kind == comm::HostEvent::Kind::stop && k) stop_job(*k);  // tend() never stops the job: only an exit does
    }
  }

  void stop_job(size_t k) {
    outcome.first_failed = static_cast<int>(k);
    signal_all(ranks_, SIGTERM);
    kill_at_ = after_seconds(grace_);
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
  Spawn spawn_;
  bool elastic_;  // --elastic: ranks restart (the status line counts what is left)
  comm::ElasticHost host_;
};

int run_launch(const LaunchOptions& o) {
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
  // job's token; another command (a torchrun-style script) gets c10d's TCPStore, unless the job
  // has a secret, which c10d's store cannot check: then the command's ranks are gasloc.Run's
  // (docs/python.md, "Launch"), meeting at gasloc's store with the job's token and the secret's
  // path in GASLOC_JOB_ID and GASLOC_SECRET_FILE; a torch.distributed script cannot join.
  // An elastic job's roster, views and heartbeats live in gasloc's store too: under --elastic the
  // command's ranks are gasloc.Run's as well (GASLOC_ELASTIC, and each incarnation in
  // GASLOC_INCARNATION), joining and healing as gasloc train ranks do.
  const bool gasloc_ranks = self_cmd && (o.cmd[1] == "train" || o.cmd[1] == "comm-check");
  const bool self_train = self_cmd && o.cmd[1] == "train";
  if (o.elastic && self_cmd && !self_train)
    throw Error("launch --elastic runs gasloc train ranks, or a Python script's gasloc.Run ranks",
                "e.g. gasloc launch --elastic -n 4 -- gasloc train --config JOB");
  const bool store_user_ranks = !gasloc_ranks && (!o.secret_file.empty() || o.elastic);
  comm::JobIdentity job{comm::random_job_token(), fmt::format("gasloc launch pid {}", ::getpid()), {}};
  if (!o.secret_file.empty()) job.secret = read_secret_file(o.secret_file);
  comm::StoreHost store_host(master_addr, o.port, std::max(60.0, o.timeout.value_or(0)), job,
                             !gasloc_ranks && !store_user_ranks);
  std::vector<std::string> args = rank_args(o, self_cmd, gasloc_ranks, job.token);
  auto envs = rank_envs(o.n, master_addr, store_host.port(), testbed != nullptr);
  if (store_user_ranks && !o.secret_file.empty())
    write_all(1, "launch: the job has a secret, which c10d's store cannot check: its ranks meet at gasloc's store, as "
                 "gasloc.Run's ranks do (a torch.distributed script cannot join; leave out --secret-file for one)\n");
  if (store_user_ranks)
    for (auto& env : envs) {
      env.push_back("GASLOC_JOB_ID=" + job.token);
      if (!o.secret_file.empty()) env.push_back("GASLOC_SECRET_FILE=" + std::filesystem::absolute(o.secret_file).string());
      if (o.elastic) env.push_back("GASLOC_ELASTIC=1");
    }

  if (self_train) say_world(o);
  const SignalCapture signals;
  // A run resumed on more ranks than saved it: those beyond start as joiners, with a donor's state.
  const int members = self_train ? founders(o) : o.n;
  auto elastic_args = [&](int id, int64_t inc) {
    if (!self_train) return args;  // a script's rank learns its incarnation from GASLOC_INCARNATION
    auto a = with_incarnation(args, inc);
    if (id >= members && inc == 0) a.insert(a.begin() + 2, {"--set", "cluster.join=true"});
    return a;
  };
  auto elastic_env = [&](int id, int64_t inc) {
    auto env = envs[id];
    if (o.elastic && !self_train) env.push_back(fmt::format("GASLOC_INCARNATION={}", inc));
    return env;
  };
  if (members < o.n)
    write_all(1, fmt::format("launch: the run was saved by {} ranks; ranks {}..{} join it with a donor's state\n",
                             members, members, o.n - 1));
  const double heartbeat_s = gasloc_ranks || store_user_ranks ? heartbeat_timeout(o, self_train) : 0.0;
  const auto policy = o.elastic ? comm::ElasticHost::Options{o.n, members, o.max_restarts, o.min_ranks, heartbeat_s}
                                : comm::ElasticHost::Options::fixed_world(o.n, heartbeat_s);
  std::vector<Rank> ranks;
  Supervisor supervisor(ranks, store_host.store(), policy, o.elastic, o.grace, [&](int id, int64_t inc) {
    return spawn_rank(exe, elastic_args(id, inc), elastic_env(id, inc), testbed.get(), id);
  });
  for (int i = 0; i < o.n; ++i)
    ranks.push_back(spawn_rank(exe, o.elastic ? elastic_args(i, 0) : args, elastic_env(i, 0), testbed.get(), i));
  supervisor.run();
  if (o.elastic) return elastic_outcome(supervisor.host(), supervisor.outcome, ranks, store_host.store(), o.n);
  return fixed_outcome(supervisor.outcome, ranks, store_host.store(), o.n);
}

}  // namespace

Action add_launch(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
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
               "gasloc train ranks with cluster.elastic (or a script's gasloc.Run ranks): a rank that dies leaves the others training, and restarts "
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


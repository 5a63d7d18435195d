#include "launch_job.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/job_config.hpp"
#include "rank_process.hpp"

extern char** environ;

namespace gasloc::app {

namespace {
// The job that the `gasloc train` ranks will run: its --config/--set, or the run.json of --resume.
train::JobConfig train_job(const LaunchOptions& o) {
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
}  // namespace

// The run.json of the run that `gasloc train --resume DIR` continues (null without --resume).
nlohmann::json resumed_run(const LaunchOptions& o) {
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

int founders(const LaunchOptions& o) {
  if (!o.elastic) return o.n;
  const auto resumed = resumed_run(o);
  return !resumed.is_null() && resumed["world"].is_number_integer() ? std::min(o.n, resumed["world"].get<int>()) : o.n;
}

// The links of the test bed: the [network] section of the job that `gasloc train` will run, else
// --netns-config/--netns-set, else defaults.
std::vector<double> testbed_links(const LaunchOptions& o, bool self_train) {
  train::JobConfig job = self_train ? train_job(o) : train::load_job(o.netns_config, o.netns_set);
  job.network.validate(o.n);
  const comm::NetworkModel links = job.network.model(o.n);
  std::vector<double> bw;
  for (int r = 0; r < o.n; ++r) bw.push_back(links.bandwidth(r));
  return bw;
}

// Every option checked before anything starts: a bad one used to be ignored (--timeout 0 or -5)
// or wrapped around (--master-port 70000 gave the ranks port 4464).
void validate(const LaunchOptions& o) {
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
std::vector<std::string> rank_args(const LaunchOptions& o, bool self_cmd, bool gasloc_ranks, const std::string& job_token) {
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
                          "TORCHELASTIC_USE_AGENT_STORE=", "TORCHELASTIC_RESTART_COUNT=", "GASLOC_JOB_ID=", "GASLOC_SECRET_FILE=",
                          "GASLOC_ELASTIC=", "GASLOC_INCARNATION="})
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

// The arguments of incarnation `inc` of a rank of an elastic run (gasloc train --incarnation).
std::vector<std::string> with_incarnation(std::vector<std::string> args, int64_t inc) {
  args.insert(args.begin() + 2, {"--incarnation", std::to_string(inc)});
  return args;
}

// Over processes the world is the number of ranks: a job file written for the in-process cluster
// with another cluster.workers would silently run another experiment, so the launcher says which wins.
void say_world(const LaunchOptions& o) {
  const int64_t workers = train_job(o).cluster.workers;
  if (workers == o.n || workers == train::JobConfig{}.cluster.workers) return;  // the default says nothing
  write_all(1, fmt::format("launch: {} ranks (-n {}) run this job; its cluster.workers = {} counts the in-process "
                           "cluster's workers only, so this is a run of {} workers, not {}\n",
                           o.n, o.n, workers, o.n, workers));
}

// The heartbeat timeout: --heartbeat-timeout, else an elastic job's cluster.heartbeat_timeout_s
// (one setting for the in-process reference and the real job), else 30 s.
double heartbeat_timeout(const LaunchOptions& o, bool self_train) {
  if (o.heartbeat_timeout) return *o.heartbeat_timeout;
  if (!o.elastic) return 30;
  if (!self_train) return train::JobConfig{}.cluster.heartbeat_timeout_s;  // a script's job file is not the launcher's to read
  const double s = train_job(o).cluster.heartbeat_timeout_s;
  comm::check_heartbeat_timeout(s, "launch: the job's cluster.heartbeat_timeout_s");
  write_all(1, fmt::format("launch: a rank without a heartbeat for {:g} s is killed and restarts (cluster.heartbeat_timeout_s; "
                           "--heartbeat-timeout overrides it)\n",
                           s));
  return s;
}

}  // namespace gasloc::app

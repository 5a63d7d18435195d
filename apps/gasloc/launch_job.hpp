// What `gasloc launch` starts: its options, checked; the ranks' command lines and environments;
// and what it reads of the job that `gasloc train` ranks will run (the world it was saved by, its
// heartbeat timeout, the links of a test bed). No process is started here.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gasloc::app {

struct LaunchOptions {
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

// Every option checked before anything starts (throws gasloc::Error).
void validate(const LaunchOptions& o);

// The ranks' command line: gasloc's own commands (self_cmd: COMMAND is this gasloc; gasloc_ranks:
// it meets at gasloc's store) get the job's token and --timeout / --bandwidth-limit as their
// arguments (gasloc reads no variable of its own); another command gets its settings from the user.
std::vector<std::string> rank_args(const LaunchOptions& o, bool self_cmd, bool gasloc_ranks, const std::string& job_token);
// The arguments of incarnation `inc` of a rank of an elastic run (gasloc train --incarnation).
std::vector<std::string> with_incarnation(std::vector<std::string> args, int64_t inc);
// Each rank's environment: the launcher's, with the torchrun variables set for that rank.
std::vector<std::vector<std::string>> rank_envs(int n, const std::string& master_addr, int port, bool testbed);

// The run.json of the run that `gasloc train --resume DIR` continues (null without --resume).
nlohmann::json resumed_run(const LaunchOptions& o);
// Elastic: the ranks that start as members of a resumed run (the world that saved it, at most
// -n); those beyond join with a donor's state. -n otherwise.
int founders(const LaunchOptions& o);
// The links of the test bed, bytes/s by rank: the [network] section of the job that `gasloc
// train` will run (self_train), else --netns-config/--netns-set, else defaults.
std::vector<double> testbed_links(const LaunchOptions& o, bool self_train);
// Says so when the job's cluster.workers differs from -n (the ranks win).
void say_world(const LaunchOptions& o);
// The heartbeat timeout: --heartbeat-timeout, else an elastic job's cluster.heartbeat_timeout_s,
// else 30 s.
// `self_train`: the ranks are gasloc train's; a script's settings are not the launcher's to read, so an elastic
// script's job gets the default of cluster.heartbeat_timeout_s (10 s) unless --heartbeat-timeout says otherwise.
double heartbeat_timeout(const LaunchOptions& o, bool self_train);

}  // namespace gasloc::app

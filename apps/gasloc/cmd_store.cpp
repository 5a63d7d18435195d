// `gasloc store`: a rendezvous store on its own, for ranks started by hand, so that no training
// rank hosts it (rank 0 dying then takes only rank 0 away, not the place where the others learn
// who failed). The ranks connect to it as to an agent's store: TORCHELASTIC_USE_AGENT_STORE=True
// and the same --job-id as the store's.
//
//   gasloc store --port 29500 --job-id myjob            # host A, until Ctrl+C
//   TORCHELASTIC_USE_AGENT_STORE=True MASTER_ADDR=A MASTER_PORT=29500 RANK=r WORLD_SIZE=n \
//     gasloc train ... --job-id myjob                   # every rank
// With --elastic -n N it also keeps the roster of an elastic job (comm::ElasticHost, by_hand;
// comm/by_hand.hpp has the ranks' side): ranks started by hand with cluster.elastic = true are admitted, judged by their heartbeats, and a
// rank started again (on any host) rejoins the running job.
#include <fmt/format.h>
#include <csignal>

#include <atomic>
#include <cmath>
#include <optional>
#include <chrono>
#include <thread>

#include "commands.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/comm/by_hand.hpp"
#include "gasloc/comm/elastic_host.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::app {

namespace {
std::atomic<bool> g_store_stop{false};
extern "C" void on_store_signal(int) { g_store_stop.store(true); }
}  // namespace

Action add_store(CLI::App& app) {
  struct Opts {
    std::string addr = "127.0.0.1", job_id, secret_file;
    int port = 29500;
    bool all_interfaces = false;
    bool elastic = false;
    int n = 0, founders = 0;
    std::optional<double> heartbeat_timeout;  // unset: the job's cluster.heartbeat_timeout_s
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--addr", o->addr, "address to listen on: MASTER_ADDR as the ranks reach it")->capture_default_str();
  app.add_option("--port", o->port, "port to listen on: MASTER_PORT (0: a free one, printed)")->capture_default_str();
  app.add_flag("--all-interfaces", o->all_interfaces, "listen on every interface, not only --addr's");
  app.add_option("--job-id", o->job_id, "the job this store serves: every rank passes the same --job-id")->required();
  app.add_option("--secret-file", o->secret_file,
                 "the job's secret (gasloc secret --out FILE): only ranks with the same cluster.secret_file are served");
  auto* elastic = app.add_flag("--elastic", o->elastic,
                               "keep the roster of an elastic job (ranks with cluster.elastic = true): admit ranks, "
                               "declare dead those whose heartbeat stalls, let a rank started again rejoin");
  app.add_option("-n,--nranks", o->n, "with --elastic: the job's number of ranks (their WORLD_SIZE)")->needs(elastic);
  app.add_option("--founders", o->founders,
                 "with --elastic: ranks 0..F-1 start the job and ranks F..n-1 join it whenever they start (room to add "
                 "workers to a running job, or to resume a run on more ranks than saved it; default: all n)")
      ->needs(elastic);
  app.add_option("--heartbeat-timeout", o->heartbeat_timeout,
                 "with --elastic: seconds without a heartbeat after which a rank is declared dead (default: the job's "
                 "cluster.heartbeat_timeout_s, which its first rank tells the store)")
      ->needs(elastic);
  return [o]() {
    if (o->port < 0 || o->port > 65535) throw Error(fmt::format("store: --port {} is outside 0..65535", o->port));
    if (o->job_id.empty()) throw Error("store: --job-id is empty", "name the job, e.g. --job-id myjob");
    if (o->elastic && o->n < 1) throw Error("store --elastic needs the job's number of ranks", "e.g. --elastic -n 4");
    if (o->elastic && (o->founders < 0 || o->founders > o->n))
      throw Error(fmt::format("store: --founders {} is outside 1..{} (-n)", o->founders, o->n),
                  "ranks 0..F-1 start the job; the others join it");
    if (o->heartbeat_timeout) comm::check_heartbeat_timeout(*o->heartbeat_timeout, "store: --heartbeat-timeout");
    comm::JobIdentity job{o->job_id, "gasloc store job " + o->job_id, {}};
    if (!o->secret_file.empty()) job.secret = read_secret_file(o->secret_file);
    comm::StoreServer server({o->addr, o->port, o->all_interfaces, job});
    fmt::print("gasloc store: serving job {}{} on {}:{} until Ctrl+C or SIGTERM; start each rank with\n"
               "  TORCHELASTIC_USE_AGENT_STORE=True MASTER_ADDR={} MASTER_PORT={} RANK=r WORLD_SIZE=n gasloc train ... "
               "--job-id {}{}\n",
               o->job_id, job.secret.empty() ? "" : " (authenticated: ranks need its secret)", server.address(),
               server.port(), o->addr, server.port(), o->job_id,
               job.secret.empty() ? "" : " --set cluster.secret_file=FILE");
    const auto keys = comm::job_keys(server.local());  // the ranks' keys, as they see them; outlives the roster host
    std::optional<comm::ElasticHost> roster;
    const auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    if (o->elastic) {
      roster.emplace(*keys,
                     comm::ElasticHost::Options{.world = o->n, .founders = o->founders,
                                                .heartbeat_timeout_s = o->heartbeat_timeout.value_or(0), .by_hand = true},
                     nullptr);
      fmt::print("gasloc store: keeping the roster of an elastic job of {} ranks (cluster.elastic = true); a rank is "
                 "declared dead after {} without a heartbeat, and rejoins when started again\n",
                 o->n, o->heartbeat_timeout ? fmt::format("{:g} s", *o->heartbeat_timeout)
                                            : std::string("the job's cluster.heartbeat_timeout_s"));
      if (o->founders > 0 && o->founders < o->n)
        fmt::print("gasloc store: ranks 0..{} start the job; ranks {}..{} join it whenever they start\n", o->founders - 1,
                   o->founders, o->n - 1);
    }
    std::fflush(stdout);
    g_store_stop.store(false);
    auto prev_int = std::signal(SIGINT, on_store_signal);
    auto prev_term = std::signal(SIGTERM, on_store_signal);
    while (!g_store_stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!roster) continue;
      for (const auto& e : roster->tend(seconds())) fmt::print("gasloc store: {:.1f} s: {}\n", seconds(), e.line);
      std::fflush(stdout);
    }
    std::signal(SIGINT, prev_int);
    std::signal(SIGTERM, prev_term);
    fmt::print("gasloc store: stopped\n");
    return 0;
  };
}

}  // namespace gasloc::app

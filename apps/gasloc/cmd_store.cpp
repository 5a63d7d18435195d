// `gasloc store`: a rendezvous store on its own, for ranks started by hand, so that no training
// rank hosts it (rank 0 dying then takes only rank 0 away, not the place where the others learn
// who failed). The ranks connect to it as to an agent's store: TORCHELASTIC_USE_AGENT_STORE=True
// and the same --job-id as the store's.
//
//   gasloc store --port 29500 --job-id myjob            # host A, until Ctrl+C
//   TORCHELASTIC_USE_AGENT_STORE=True MASTER_ADDR=A MASTER_PORT=29500 RANK=r WORLD_SIZE=n \
//     gasloc train ... --job-id myjob                   # every rank
#include <fmt/format.h>
#include <csignal>

#include <atomic>
#include <chrono>
#include <thread>

#include "commands.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::app {

namespace {
std::atomic<bool> g_store_stop{false};
extern "C" void on_store_signal(int) { g_store_stop.store(true); }
}  // namespace

Action add_store(CLI::App& app) {
  struct Opts {
    std::string addr = "127.0.0.1", job_id;
    int port = 29500;
    bool all_interfaces = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--addr", o->addr, "address to listen on: MASTER_ADDR as the ranks reach it")->capture_default_str();
  app.add_option("--port", o->port, "port to listen on: MASTER_PORT (0: a free one, printed)")->capture_default_str();
  app.add_flag("--all-interfaces", o->all_interfaces, "listen on every interface, not only --addr's");
  app.add_option("--job-id", o->job_id, "the job this store serves: every rank passes the same --job-id")->required();
  return [o]() {
    if (o->port < 0 || o->port > 65535) throw Error(fmt::format("store: --port {} is outside 0..65535", o->port));
    if (o->job_id.empty()) throw Error("store: --job-id is empty", "name the job, e.g. --job-id myjob");
    comm::StoreServer server({o->addr, o->port, o->all_interfaces, {o->job_id, "gasloc store job " + o->job_id}});
    fmt::print("gasloc store: serving job {} on {}:{} until Ctrl+C or SIGTERM; start each rank with\n"
               "  TORCHELASTIC_USE_AGENT_STORE=True MASTER_ADDR={} MASTER_PORT={} RANK=r WORLD_SIZE=n gasloc train ... "
               "--job-id {}\n",
               o->job_id, server.address(), server.port(), o->addr, server.port(), o->job_id);
    std::fflush(stdout);
    g_store_stop.store(false);
    auto prev_int = std::signal(SIGINT, on_store_signal);
    auto prev_term = std::signal(SIGTERM, on_store_signal);
    while (!g_store_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::signal(SIGINT, prev_int);
    std::signal(SIGTERM, prev_term);
    fmt::print("gasloc store: stopped\n");
    return 0;
  };
}

}  // namespace gasloc::app

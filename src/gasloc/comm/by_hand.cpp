#include "gasloc/comm/by_hand.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "gasloc/comm/elastic_roster.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace elastic_keys {
std::string world() { return "el/world"; }
std::string claim(int id) { return fmt::format("el/inc/{}", id); }
std::string admit(int id, int64_t inc) { return fmt::format("el/admit/{}.{}", id, inc); }
std::string founded() { return "el/founded"; }
std::string out(int id) { return fmt::format("el/out/{}", id); }
std::string founders() { return "el/founders"; }
std::string heartbeat_timeout() { return "el/heartbeat_timeout"; }
}  // namespace elastic_keys

namespace {

using admission::kJoiner;
using admission::kMember;
using admission::kRefused;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Polls `key` until it exists or `timeout_s` passed; false on timeout.
bool await_key(c10d::Store& store, const std::string& key, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  while (!store.check({key})) {
    if (now_s() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int parse_count(const std::string& text, const std::string& what) {
  try {
    return std::stoi(text);
  } catch (const std::exception&) {
    throw CommError(fmt::format("the job's store holds '{}' as its {}", text, what),
                    "another program or gasloc version wrote the job's store");
  }
}

// The store's --founders; without the key, every id founds the job.
int founders_of(c10d::Store& store) {
  if (!store.check({elastic_keys::founders()})) return std::numeric_limits<int>::max();
  return parse_count(to_text(store.get(elastic_keys::founders())), "number of founding ranks");
}

std::string founders_not_started(c10d::Store& store) {
  const int founders = founders_of(store);
  std::vector<int> ids;
  for (const auto& e : Roster::decode(to_text(store.get(elastic_keys::roster()))).entries)
    if (e.id < founders && e.state != RankState::member) ids.push_back(e.id);
  return fmt::format("{}", fmt::join(ids, ", "));
}

}  // namespace

Admission admit_by_hand(c10d::Store& store, int id, int world, double timeout_s) {
  if (!store.check({elastic_keys::world()}))
    throw CommError("the job's store keeps no roster of elastic ranks",
                    "start it with `gasloc store --elastic -n N --job-id JOB` (or start the ranks with gasloc launch "
                    "--elastic, which keeps the roster itself)");
  const int host_world = parse_count(to_text(store.get(elastic_keys::world())), "number of ranks");
  if (world != host_world)
    throw ConfigError(fmt::format("WORLD_SIZE is {} here but the job's gasloc store serves {} ranks (-n {})", world,
                                  host_world, host_world),
                      fmt::format("start every rank with WORLD_SIZE={}", host_world));
  if (id < 0 || id >= world)
    throw ConfigError(fmt::format("RANK {} is outside 0..{} of the job's gasloc store", id, world - 1),
                      "a worker added to a running job takes the id of one that left, or one of the ids the store "
                      "keeps for joiners (gasloc store --elastic -n N --founders F: ids F..N-1)");
  const int64_t inc = store.add(elastic_keys::claim(id), 1) - 1;
  const std::string key = elastic_keys::admit(id, inc);
  if (!await_key(store, key, timeout_s))
    throw CommError(fmt::format("rank {}: the gasloc store did not answer its start (incarnation {}) within {} s", id, inc,
                                timeout_s),
                    "is the store started with --elastic, and still running?");
  const std::string answer = to_text(store.get(key));
  if (answer.rfind(kRefused, 0) == 0)
    throw ConfigError(fmt::format("rank {} cannot start: {}", id, answer.substr(std::string(kRefused).size())),
                      "stop the running process of this rank first, or start this one with another RANK");
  return {inc, answer == kMember};
}

void await_founded(c10d::Store& store, int id, double timeout_s) {
  if (!await_key(store, elastic_keys::founded(), timeout_s))
    throw CommError(fmt::format("rank {}: the job's other founding ranks did not all start within {} s (not started: {})",
                                id, timeout_s, founders_not_started(store)),
                    "start every founding rank of the job (0..WORLD_SIZE-1, or 0..F-1 under --founders F) at its "
                    "gasloc store");
}

bool founds_the_job(c10d::Store& store, int id) {
  return !store.check({elastic_keys::founded()}) && id < founders_of(store);
}

void announce_out(c10d::Store& store, int id, int64_t inc) noexcept {
  try {
    store.set(elastic_keys::out(id), to_bytes(std::to_string(inc)));
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: could not say in the job's store that incarnation {} ended ({}): the store's host sees it "
                 "leave at the heartbeat timeout instead",
                 id, inc, e.what());
  }
}

}  // namespace gasloc::comm

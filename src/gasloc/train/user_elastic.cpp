// UserRun's elastic half (docs/python.md, "Elastic runs"): a Python rank under `gasloc launch
// --elastic` takes part in the job's membership as a `gasloc train` rank does (the store's views,
// heartbeats, ElasticProcess's join), and heals a restarted rank from a donor. What differs from
// Worker::heal is the state: the user's optimizer state and `state=` value have no shape the
// joiner knows beforehand (its optimizer has not stepped), so the donor's state travels
// self-described (its tensors' names, dtypes and shapes in a JSON header) after its size.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <cstring>

#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/elastic_process.hpp"
#include "gasloc/train/signals.hpp"
#include "gasloc/train/user_run.hpp"

namespace gasloc::train {

namespace {

// [8 bytes: the header's length][the header: JSON {"tensors": [{key, dtype, shape, offset,
// bytes}], "meta": meta}][every tensor's bytes, in key order].
torch::Tensor encode_state(const StateDict& tensors, const nlohmann::json& meta) {
  nlohmann::json entries = nlohmann::json::array();
  std::vector<torch::Tensor> parts(1);
  int64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    const int64_t bytes = c.numel() * static_cast<int64_t>(c.element_size());
    entries.push_back({{"key", key},
                       {"dtype", static_cast<int>(c.scalar_type())},
                       {"shape", c.sizes().vec()},
                       {"offset", offset},
                       {"bytes", bytes}});
    if (bytes > 0) parts.push_back(c.reshape({-1}).view(torch::kUInt8));
    offset += bytes;
  }
  const std::string header = nlohmann::json{{"tensors", entries}, {"meta", meta}}.dump();
  const auto length = static_cast<int64_t>(header.size());
  parts[0] = torch::empty({8 + length}, torch::kUInt8);
  auto* p = parts[0].data_ptr<uint8_t>();
  std::memcpy(p, &length, 8);
  std::memcpy(p + 8, header.data(), header.size());
  return torch::cat(parts);
}

// The tensors into `tensors`; returns the meta.
nlohmann::json decode_state(const torch::Tensor& bytes, StateDict& tensors) {
  const auto* p = bytes.data_ptr<uint8_t>();
  int64_t length = 0;
  if (bytes.numel() >= 8) std::memcpy(&length, p, 8);
  if (bytes.numel() < 8 || length < 0 || 8 + length > bytes.numel())
    throw CommError("heal: the donor's state is not a gasloc.Run state", "donor and joiner must run the same gasloc");
  const auto header = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(p + 8), length));
  const int64_t base = 8 + length;
  for (const auto& e : header.at("tensors")) {
    const int64_t offset = e.at("offset").get<int64_t>(), n = e.at("bytes").get<int64_t>();
    const auto dtype = static_cast<torch::ScalarType>(e.at("dtype").get<int>());
    const auto shape = e.at("shape").get<std::vector<int64_t>>();
    if (base + offset + n > bytes.numel()) throw CommError("heal: the donor's state is shorter than its header says");
    tensors[e.at("key").get<std::string>()] =
        n == 0 ? torch::empty(shape, torch::TensorOptions().dtype(dtype))
               : bytes.narrow(0, base + offset, n).clone().view(dtype).reshape(shape);
  }
  return header.value("meta", nlohmann::json::object());
}

// FNV-1a over the parameters' bytes: whether two ranks start from the same parameters.
std::string fingerprint(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  const auto* b = static_cast<const uint8_t*>(c.data_ptr());
  const int64_t n = c.numel() * static_cast<int64_t>(c.element_size());
  uint64_t h = 1469598103934665603ULL;
  for (int64_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return fmt::format("{:016x}", h);
}

// Whether incarnation `inc` of `id` (-1: any) announced that it leaves (ElasticRoster::announce_leave).
bool announced_leave(c10d::Store& store, int id, int64_t inc) {
  const std::string key = comm::elastic_keys::left(id);
  if (!store.check({key})) return false;
  const std::string text = comm::to_text(store.get(key));
  return inc < 0 || text.rfind(std::to_string(inc) + ":", 0) == 0;
}

}  // namespace

// The founding ranks must start alike: with no collective over all ranks there is no broadcast
// of rank 0's parameters, so the first rank's fingerprint is the job's and a rank that differs is
// refused (a restarted rank takes its donor's parameters instead and is not asked).
void UserRun::agree_initial_params() {
  auto& store = cluster_.elastic_roster()->store();
  const std::string mine = fingerprint(params_.data());
  const std::string first = comm::to_text(store.compareSet("el/user/params0", {}, comm::to_bytes(mine)));
  if (first != mine)
    throw ConfigError(fmt::format("rank {} starts from other parameters than the ranks before it: an elastic job's ranks "
                                  "do not take rank 0's parameters (it has no collective over all ranks)",
                                  rank_),
                      "seed the model alike on every rank (torch.manual_seed(S) before building it), or load the same "
                      "weights on each");
}

void UserRun::join_running_job() {
  const int64_t at = elastic_->join([this](const algo::HealPlan& plan) { return receive_heal(plan); },
                                    [this] { return step_; });
  if (at < 0)
    throw Error(fmt::format("worker {}: the job finished before it could rejoin", rank_), "nothing to do: the others ended the run");
}

// A joiner's side of the transfer: the donor's size, then its state.
bool UserRun::receive_heal(const algo::HealPlan& plan) {
  comm::Communicator& comm = cluster_.comm(rank_);
  std::vector<torch::Tensor> recv;
  comm.exchange(plan.peers, torch::zeros({1}, torch::kInt64), recv);
  if (recv.empty() || !recv.at(0).defined()) return false;
  const int64_t n = recv.at(0).item<int64_t>();
  comm.exchange(plan.peers, torch::zeros({n}, torch::kUInt8), recv);
  if (!recv.at(0).defined()) return false;
  StateDict state;
  const nlohmann::json meta = decode_state(recv.at(0), state);
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor& p = state.at("params");
    if (p.numel() != params_.numel())
      throw CommError(fmt::format("heal: the donor holds {} parameters and this rank {}", p.numel(), params_.numel()),
                      "donor and joiner must run the same model");
    params_.data().copy_(p.to(params_.data().device()));
  }
  algo::StateDict sync_state;
  UserState user{{}, meta.value("user", nlohmann::json())};
  for (const auto& [k, v] : state) {
    if (k.rfind("sync.", 0) == 0) sync_state[k.substr(5)] = v.to(params_.data().device());
    if (k.rfind("user.", 0) == 0) user.tensors[k.substr(5)] = v;
  }
  sync_->load_state(sync_state);
  step_ = logged_step_ = meta.at("step").get<int64_t>();
  resumed_ = std::move(user);
  return true;
}

// A donor's side: its whole state, as the joiner keeps it (the synchronizer's Mix says which keys).
void UserRun::heal(const UserState& user) {
  if (!pending_heal_) return;
  const algo::HealPlan plan = *pending_heal_;
  pending_heal_.reset();
  comm::Communicator& comm = cluster_.comm(rank_);
  sync_->settle(comm);  // an overlapped exchange in flight: its result goes into the state
  StateDict state;
  state["params"] = params_.data();
  for (const auto& [k, v] : sync_->state()) state["sync." + k] = v;
  sync_->keep_for_joiner(state, "sync.", params_.numel());
  for (const auto& [k, v] : user.tensors) state["user." + k] = v;
  const torch::Tensor payload = encode_state(state, {{"step", step_}, {"user", user.json}});
  std::vector<torch::Tensor> recv;
  comm.exchange(plan.peers, torch::tensor({payload.numel()}, torch::kInt64), recv);
  comm.exchange(plan.peers, payload, recv);
}

void UserRun::after_round_elastic() {
  const auto view = sync_->take_ended_view();
  if (!view) return;
  if (auto plan = algo::heal_plan(*view, rank_); plan && !plan->receives && !plan->peers.empty()) pending_heal_ = *plan;
  if (!view->dying.empty() || !view->joining.empty() || !view->left.empty()) report_view(*view);
}

// A round whose membership changed goes to metrics and the output, from its lowest survivor; a
// rank that announced its leave is listed as left, not as dead.
void UserRun::report_view(const algo::View& v) {
  const auto survivors = v.survivors();
  if (survivors.empty() || survivors.front() != rank_) return;
  auto& store = cluster_.elastic_roster()->store();
  ViewEvent e;
  e.step = step_;
  e.worker = rank_;
  e.round = v.round;
  e.members.assign(v.members.begin(), v.members.end());
  e.died.assign(v.dying.begin(), v.dying.end());
  for (int id : v.left) {
    const auto inc = v.incarnation.find(id);
    (announced_leave(store, id, inc == v.incarnation.end() ? -1 : inc->second) ? e.left : e.died).push_back(id);
  }
  for (int j : v.joining) {
    e.joined.push_back(j);
    if (const auto inc = v.incarnation.find(j); inc != v.incarnation.end()) e.joined_incarnations.push_back(inc->second);
  }
  e.virtual_time_s = counters().wall_time_s;
  metrics_->write(e);
  std::string line = fmt::format("step {:>6} | round {}: {} workers in the view", step_, v.round, v.members.size());
  if (!e.died.empty()) line += fmt::format(", worker(s) {} died", fmt::join(e.died, ", "));
  if (!e.left.empty()) line += fmt::format(", worker(s) {} left (announced)", fmt::join(e.left, ", "));
  for (int j : v.joining) line += fmt::format(", worker {} joined (state from worker {})", j, v.donor(j));
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);  // a pipe buffers: the launcher shows it now, not at the process's end
}

void UserRun::leave(const UserState& user) {
  if (!elastic_) throw Error("leave() outside an elastic run", "a run under gasloc launch -n N closes with every rank");
  if (closed_) return;
  if (step_ > 0 && step_ > checkpointed_) checkpoint(user);  // committed on its own: no rank waits for another
  cluster_.elastic_roster()->announce_leave(step_);
  closed_ = true;
  if (step_ > logged_step_) write_train_line(false);
  metrics_.reset();
  lock_.reset();
  signals_.reset();
}

}  // namespace gasloc::train

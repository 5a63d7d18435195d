#include "gasloc/train/run.hpp"

#include "gasloc/train/host_fit.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/version.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include "gasloc/algo/registry.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

const std::vector<std::string>& state_keys() {
  // What a checkpoint's state means depends on these: the rounds (H, the policy, the overlap), the
  // graph and the form that mixed it, the codec whose state it carries (error feedback, owners'
  // feedback, modulo gaps, the delta reference: their shapes follow the chunk), the clipper's
  // window, and each worker's slice of the data.
  static const std::vector<std::string> keys = {
      "algo.H",           "algo.h_policy",        "algo.overlap_steps",  "algo.topology",
      "algo.form",        "algo.wire_dtype",      "algo.compression",    "algo.compression_chunk",
      "algo.topk_density", "algo.error_feedback", "algo.error_feedback_decay", "algo.gossip_codec",
      "algo.reference_every", "algo.modulo_margin", "algo.clip_peers",   "data.sampling"};
  return keys;
}

namespace {
// A setting's value in a stored run's config; one the run predates ran at today's default.
nlohmann::json stored_value(const nlohmann::json& stored, const std::string& section, const std::string& key) {
  static const nlohmann::json defaults = JobConfig{}.to_json();
  if (stored.contains(section) && stored[section].is_object() && stored[section].contains(key)) return stored[section][key];
  return defaults.value(section, nlohmann::json::object()).value(key, nlohmann::json());
}

// The resume's changes to the settings the state depends on: refused naming each (a resume with
// another codec was accepted and run.json rewritten as if the whole run had used it), unless
// --allow-change names it. The algorithm is the checkpoints' own: never changed.
std::vector<SettingChange> resume_changes(const TrainRequest& req, const nlohmann::json& stored, const JobConfig& job) {
  const nlohmann::json now = job.to_json();
  for (const std::string& k : req.allow_change)
    if (std::find(state_keys().begin(), state_keys().end(), k) == state_keys().end())
      throw ConfigError(fmt::format("--allow-change {}: not a setting a resume refuses to change", k),
                        fmt::format("it names one of {}; other settings change with --set alone", fmt::join(state_keys(), ", ")));
  const nlohmann::json old_name = stored_value(stored, "algo", "name");
  if (old_name != now["algo"]["name"])
    throw ConfigError(fmt::format("config key 'algo.name': the run '{}' trains {}, this resume asks for {}", req.resume_dir,
                                  old_name.dump(), now["algo"]["name"].dump()),
                      "a resume keeps the algorithm its checkpoints hold the state of; start a new run in another "
                      "train.run_dir");
  std::vector<SettingChange> changes;
  for (const std::string& k : state_keys()) {
    const std::string section = k.substr(0, k.find('.')), key = k.substr(k.find('.') + 1);
    const nlohmann::json was = stored_value(stored, section, key), is = now[section][key];
    if (was == is) continue;
    if (std::find(req.allow_change.begin(), req.allow_change.end(), k) == req.allow_change.end())
      throw ConfigError(fmt::format("config key '{}': the run '{}' was trained with {} = {}, this resume asks for {}: its "
                                    "checkpoints' state depends on it",
                                    k, req.resume_dir, k, was.dump(), is.dump()),
                        fmt::format("resume without changing it, or say so with --allow-change {} (run.json and "
                                    "metrics.jsonl then record the change at the step it takes effect)",
                                    k));
    changes.push_back({k, was, is});
  }
  return changes;
}
}  // namespace

JobConfig resolve_job(const TrainRequest& req, std::vector<SettingChange>* changes) {
  if (req.resume_dir.empty()) {
    if (req.resume_step >= 0) throw ConfigError("--resume-step needs --resume RUN");
    if (req.repair) throw ConfigError("--repair needs --resume RUN", "gasloc train --resume RUN --repair");
    if (!req.allow_change.empty())
      throw ConfigError("--allow-change needs --resume RUN", "gasloc train --resume RUN --set KEY=VALUE --allow-change KEY");
    return load_job(req.config_path, req.overrides);
  }
  if (!req.config_path.empty())
    throw ConfigError("--resume takes the configuration from RUN/run.json; do not pass --config too",
                      "use --resume RUN [--set key=value ...] to change settings such as train.steps");
  const fs::path run_json = fs::path(req.resume_dir) / "run.json";
  if (!fs::exists(run_json))
    throw CheckpointError("'" + req.resume_dir + "' is not a gasloc run directory (no run.json)",
                          "pass the run_dir of an earlier `gasloc train`");
  auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
  if (doc.is_discarded() || !doc.contains("config")) throw CheckpointError("corrupt '" + run_json.string() + "'");
  // A run made before train.streams existed ran one stream; auto might plan more on resume.
  if (doc["config"].contains("train") && doc["config"]["train"].is_object() && !doc["config"]["train"].contains("streams"))
    doc["config"]["train"]["streams"] = 1;
  // A resumed run goes on to train.steps unless told again; the user's --set come last and win.
  std::vector<std::string> overrides = {"train.run_dir=" + req.resume_dir, "train.stop_at=0"};
  overrides.insert(overrides.end(), req.overrides.begin(), req.overrides.end());
  JobConfig job = job_from_json(doc["config"], overrides);
  const auto changed = resume_changes(req, doc["config"], job);
  if (changes) *changes = changed;
  return job;
}

CheckpointMeta CheckpointMeta::from_json(const nlohmann::json& m) {
  return {m.value("model", nlohmann::json{}), m.value("optim", std::string("?")), m.value("algo", std::string("?")),
          m.value("world", 0)};
}

nlohmann::json Counters::to_json() const {
  return {{"bytes_sent", bytes_sent}, {"virtual_time_s", virtual_time_s}, {"wall_time_s", wall_time_s}, {"idle_s", idle_s},
          {"eval_time_s", eval_time_s}, {"compute_s", compute_s}};
}

Counters Counters::from_json(const nlohmann::json& j) {
  return {j.value("bytes_sent", int64_t{0}), j.value("virtual_time_s", 0.0), j.value("wall_time_s", 0.0),
          j.value("idle_s", 0.0), j.value("eval_time_s", 0.0), j.value("compute_s", 0.0)};
}

Run::Run(const JobConfig& job, const model::LlamaConfig& mc, int world, std::vector<SettingChange> changes)
    : job_(job), mc_(mc), world_(world), dir_(job.train.run_dir), resolved_(job.to_json()), changes_(std::move(changes)) {
  resolved_["cluster"]["workers"] = world;
}

nlohmann::json Run::model_json() const {
  const auto& c = mc_;
  return {{"dim", c.dim},           {"n_layers", c.n_layers},       {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size}, {"ffn_hidden", c.ffn_hidden()},
          {"rope_theta", c.rope_theta}, {"max_seq_len", c.max_seq_len}, {"tie_embeddings", c.tie_embeddings},
          {"norm_eps", c.norm_eps},   {"num_params", c.num_params()}};
}

Checkpoint Run::load(const RunCheckpoints& ckpts, int64_t step, int rank, const std::vector<int64_t>& committed) const {
  const fs::path path = ckpts.file(step, rank);
  Checkpoint c;
  try {
    c = load_checkpoint(path);
  } catch (const CheckpointError& e) {
    // The previous committed step of this rank is kept for this case.
    std::string hint = e.hint();
    for (int64_t prev : committed)
      if (prev < step) {
        hint = fmt::format("resume from the previous committed step with `gasloc train --resume {} --resume-step {}`",
                           dir_.string(), prev);
        break;
      }
    throw CheckpointError(e.what(), hint);
  }
  const auto got = CheckpointMeta::from_json(c.meta);
  auto expected = meta();
  if (got.world != world_ && world_may_change()) expected.world = got.world;  // check_resume_world said why
  check_checkpoint_meta(path, got, expected);
  return c;
}

void check_checkpoint_meta(const fs::path& path, const CheckpointMeta& got, const CheckpointMeta& expected) {
  if (got == expected) return;
  std::string diffs;
  const auto flat_got = got.to_json().flatten(), flat_want = expected.to_json().flatten();
  for (auto& [k, v] : flat_want.items())
    if (flat_got.value(k, nlohmann::json()) != v)
      diffs += fmt::format("{}{} is {} in the checkpoint, {} in this job", diffs.empty() ? "" : "; ", k.substr(1),
                           flat_got.value(k, nlohmann::json()).dump(), v.dump());
  std::replace(diffs.begin(), diffs.end(), '/', '.');
  throw CheckpointError(fmt::format("checkpoint '{}' differs from this job: {}", path.string(), diffs),
                        "resume with the model, optimizer, algorithm and cluster the run was started with");
}

namespace {
// train.streams as the job ran or will run it: auto (0) planned for this machine's cores, and the
// one stream of every run made before the setting existed (not today's default, auto).
nlohmann::json with_planned_streams(nlohmann::json config) {
  if (!config.is_object() || !config.contains("train") || !config["train"].is_object()) return config;
  auto& train = config["train"];
  if (!train.contains("streams")) {
    train["streams"] = 1;
    return config;
  }
  const auto data = config.value("data", nlohmann::json::object()), cluster = config.value("cluster", nlohmann::json::object());
  if (train["streams"].is_number_integer() && train["streams"].get<int64_t>() == 0)
    train["streams"] = planned_streams(0, train.value("device", std::string("cpu")), data.value("batch_size", int64_t{1}),
                                       cluster.value("workers", 1), usable_cpus());
  return config;
}
}  // namespace

std::string config_difference(const nlohmann::json& expected_as_given, const nlohmann::json& stored_as_given) {
  static const nlohmann::json defaults = JobConfig{}.to_json();
  const nlohmann::json expected = with_planned_streams(expected_as_given), stored = with_planned_streams(stored_as_given);
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    // A section added since the run was made, at its defaults, is what the run did.
    if (!stored.contains(it.key()) && defaults.contains(it.key()) && defaults[it.key()] == it.value()) continue;
    if (!stored.contains(it.key())) return it.key();
    for (auto jt = it.value().begin(); jt != it.value().end(); ++jt) {
      const std::string key = it.key() + "." + jt.key();
      if (key == "train.run_dir" || key == "train.stop_at") continue;
      // Without overlap its variant does nothing: a run made when eager was the default is the same run.
      if (key == "algo.overlap" && it.value().value("overlap_steps", int64_t{0}) == 0 &&
          stored[it.key()].value("overlap_steps", int64_t{0}) == 0)
        continue;
      const bool newer = !stored[it.key()].contains(jt.key()) && defaults.contains(it.key()) &&
                         defaults[it.key()].contains(jt.key()) && defaults[it.key()][jt.key()] == jt.value();
      if (newer) continue;
      if (!stored[it.key()].contains(jt.key()) || stored[it.key()][jt.key()] != jt.value()) return key;
    }
  }
  return "";
}

void Run::check_fresh(const RunCheckpoints& ckpts, const std::vector<int>* ranks) const {
  if (ckpts.any(ranks))
    throw CheckpointError("run directory '" + dir_.string() + "' already holds checkpoints",
                          "continue it with --resume " + dir_.string() + ", or choose another train.run_dir");
  const fs::path run_json = dir_ / "run.json";
  if (fs::exists(run_json)) {
    auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
    const nlohmann::json stored = doc.is_discarded() ? nlohmann::json() : doc.value("config", nlohmann::json());
    const std::string diff = stored.is_object() ? config_difference(resolved_, stored) : "config";
    if (!diff.empty())
      throw CheckpointError("run directory '" + dir_.string() + "' holds another run (its run.json has another "
                            "configuration: it differs at '" + diff + "')",
                            "choose another train.run_dir, or remove that directory if the run is not needed");
  } else if (fs::exists(dir_ / "metrics.jsonl")) {
    throw CheckpointError("run directory '" + dir_.string() + "' holds metrics of an unknown run",
                          "choose another train.run_dir, or remove that directory");
  }
}

bool Run::world_may_change() const { return job_.cluster.elastic && job_.data.sampling != "disjoint"; }

int Run::check_resume_world(bool announce) const {
  const fs::path run_json = dir_ / "run.json";
  auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
  if (doc.is_discarded() || !doc.contains("world") || !doc["world"].is_number_integer()) return world_;  // load() checks each file
  const int saved = doc["world"].get<int>();
  if (saved != world_ && world_may_change()) {
    const std::string others =
        saved > world_ ? fmt::format("ids {}..{} are left out", world_, saved - 1)
                       : fmt::format("ids {}..{} join at the first round's merge with a donor's state", saved, world_ - 1);
    if (announce)
      fmt::print("resuming '{}', saved by {} workers, on {}: ids 0..{} continue from their own checkpoints, {} (an "
                 "elastic run)\n",
                 dir_.string(), saved, world_, std::min(saved, world_) - 1, others);
    return saved;
  }
  if (saved != world_ && job_.cluster.elastic)
    throw CheckpointError(fmt::format("run '{}' was saved by {} workers with data.sampling = \"disjoint\": on {} each "
                                      "worker's slice of the data would move",
                                      dir_.string(), saved, world_),
                          fmt::format("resume it on {} ranks", saved));
  if (saved != world_)
    throw CheckpointError(fmt::format("run '{}' was saved by {} worker{} but this job has {}", dir_.string(), saved,
                                      saved == 1 ? "" : "s", world_),
                          (job_.cluster.backend == "inproc"
                               ? fmt::format("resume it with cluster.workers = {} (the default)", saved)
                               : fmt::format("resume it on {} ranks (gasloc launch -n {})", saved, saved)));
  return saved;
}

std::string check_memory(const model::LlamaConfig& mc, const JobConfig& job, int local_workers) {
  if (job.train.device != "cpu") return {};
  // Before the workers exist their state is bounded: Adam's two moments and an algorithm's anchor
  // and momentum, 16 bytes a parameter.
  const int slots = planned_compute_slots(job, local_workers);
  return check_workers_fit(local_workers, estimated_worker_memory(mc, job.data.batch_size, job.data.seq_len, 16.0),
                           slots > 0 ? slots : local_workers, available_memory_bytes());
}

namespace {
// run.json's "changes" for a run resumed at `step`: the earlier ones up to it (a resume from an
// older step drops the later ones, as it drops their metrics), then `changes` at `step`, each
// (step, key) once: processes that share the directory each write the file.
nlohmann::json changes_at(const fs::path& run_json, int64_t step, const std::vector<SettingChange>& changes) {
  nlohmann::json out = nlohmann::json::array();
  if (step < 0) return out;
  if (fs::exists(run_json)) {
    const auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
    if (!doc.is_discarded() && doc.contains("changes") && doc["changes"].is_array())
      for (const auto& c : doc["changes"])
        if (c.is_object() && c.value("step", int64_t{0}) <= step) out.push_back(c);
  }
  for (const SettingChange& c : changes) {
    const nlohmann::json entry = {{"step", step}, {"key", c.key}, {"old", c.old_value}, {"new", c.new_value}};
    auto same = [&](const nlohmann::json& e) { return e.value("step", int64_t{-1}) == step && e.value("key", "") == c.key; };
    out.erase(std::remove_if(out.begin(), out.end(), same), out.end());
    out.push_back(entry);
  }
  return out;
}
}  // namespace

void Run::write_info(const data::Dataset& dataset, int64_t resumed_at) const {
  nlohmann::json info = {{"config", resolved_},
                         {"model", model_json()},
                         {"world", world_},
                         {"seed", job_.train.seed},
                         {"dataset", {{"dir", dataset.dir.string()}, {"tokenizer", dataset.tokenizer_kind},
                                      {"train_tokens", dataset.train->size()}, {"val_tokens", dataset.val->size()},
                                      {"fingerprint", dataset.fingerprint}}},
                         {"versions", {{"gasloc", "0.1.0"}, {"torch", TORCH_VERSION}}}};
  // The run carries what reading it back needs (its tokenizer and the dataset's description), so
  // that it can move to another path or machine, and a dataset prepared again in data.dir
  // cannot change what it decodes.
  if (fs::exists(dataset.dir / "dataset.json")) {
    const fs::path copy = dir_ / kRunDatasetDir;
    fs::create_directories(copy);
    for (const char* name : {"dataset.json", "tokenizer.model"})
      if (fs::exists(dataset.dir / name)) write_file_atomic_shared(copy / name, read_file(dataset.dir / name));
    info["dataset"]["copy"] = kRunDatasetDir;
  }
  // The config is what the run trains with from here on; "changes" says where it differed before.
  info["changes"] = changes_at(dir_ / "run.json", resumed_at, changes_);
  write_file_atomic_shared(dir_ / "run.json", info.dump(2) + "\n");
}

void Run::print() const {
  const auto& mc = mc_;
  fmt::print("gasloc train: resolved configuration ({} worker{}{})\n", world_, world_ == 1 ? "" : "s",
             job_.cluster.backend == "inproc" ? "" : fmt::format(", {} processes", world_));
  // A model field left at 0 takes the preset's value: show which.
  const nlohmann::json shape = {{"dim", mc.dim},         {"n_layers", mc.n_layers},       {"n_heads", mc.n_heads},
                                {"n_kv_heads", mc.n_kv_heads}, {"multiple_of", mc.multiple_of}, {"max_seq_len", mc.max_seq_len},
                                {"ffn_dim_multiplier", mc.ffn_dim_multiplier}};
  for (auto& [section, values] : resolved_.items()) {
    fmt::print("  [{}]\n", section);
    for (auto& [k, v] : values.items()) {
      const bool from_preset = section == "model" && shape.contains(k) && v.is_number() && v.get<double>() == 0;
      fmt::print("    {} = {}{}\n", k, v.dump(), from_preset ? fmt::format("  (preset {}: {})", job_.model.preset, shape[k].dump()) : "");
    }
  }
  fmt::print("  model: dim {} layers {} heads {}/{} ffn {} vocab {} max_seq_len {} -> {:.2f}M parameters\n", mc.dim,
             mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.ffn_hidden(), mc.vocab_size, mc.max_seq_len,
             static_cast<double>(mc.num_params()) / 1e6);
  std::fflush(stdout);
}

void Run::print_summary() const {
  const auto& algo = job_.algo;
  const auto& entry = algo::algorithm(algo.name.str());
  std::string method = algo.name.str();
  if (entry.needs_topology) method += "-" + algo.topology.str();
  if (entry.has_rounds) method += fmt::format(" H={}", algo.H);
  fmt::print("gasloc train: {} ({:.2f}M parameters), {} with {}, {} worker{} ({}), {} steps, data '{}', run '{}' "
             "(full configuration: {}/run.json, or --verbose)\n",
             job_.model.preset, static_cast<double>(mc_.num_params()) / 1e6, method, job_.optim.name.str(), world_,
             world_ == 1 ? "" : "s", job_.cluster.backend.str(), job_.train.steps, job_.data.dir, dir_.string(),
             dir_.string());
  std::fflush(stdout);
}

namespace {
// Keys that may differ between ranks (paths and thread counts of each host).
const std::vector<std::pair<std::string, std::string>> kRankLocal = {
    {"train", "run_dir"}, {"train", "threads"}, {"train", "blas_threads"}, {"data", "dir"}, {"cluster", "timeout_s"},
    {"cluster", "workers"}, {"cluster", "store_all_interfaces"}, {"cluster", "join"}, {"cluster", "secret_file"}};

// The settings every rank of a job shares: the resolved job without the keys that may differ
// between ranks (paths and thread counts of each host, the timeout, the world).
nlohmann::json shared_settings(const nlohmann::json& resolved) {
  nlohmann::json mine = resolved;
  for (const auto& [sec, key] : kRankLocal)
    if (mine.contains(sec)) mine[sec].erase(key);
  return mine;
}
}  // namespace

nlohmann::json shared_config(const nlohmann::json& resolved, const std::string& data_fingerprint) {
  nlohmann::json mine = shared_settings(resolved);
  mine["data"]["fingerprint"] = data_fingerprint;
  return mine;
}

void agree_on_config(comm::Communicator& c, const nlohmann::json& resolved, const std::string& data_fingerprint) {
  const std::string text = shared_config(resolved, data_fingerprint).dump();
  std::vector<nlohmann::json> all(static_cast<size_t>(c.world()));
  for (int root = 0; root < c.world(); ++root) {
    auto len = torch::tensor({static_cast<int64_t>(root == c.rank() ? text.size() : 0)}, torch::kInt64);
    c.broadcast(len, root);
    auto bytes = torch::empty({len.item<int64_t>()}, torch::kUInt8);
    if (root == c.rank()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
    c.broadcast(bytes, root);
    all[root] = nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
  }
  std::string diffs;
  for (int r = 1; r < c.world(); ++r)
    for (auto& [sec, values] : all[0].items())
      for (auto& [key, v0] : values.items()) {
        const nlohmann::json vr = all[r][sec].value(key, nlohmann::json());
        if (vr != v0) diffs += fmt::format("{}{}.{} is {} on rank {} but {} on rank 0", diffs.empty() ? "" : "; ", sec, key, vr.dump(), r, v0.dump());
      }
  if (!diffs.empty())
    throw ConfigError("the ranks were started with different configurations: " + diffs,
                      diffs.find("data.fingerprint") != std::string::npos
                          ? "data.fingerprint is dataset.json's and the shard sizes' checksum: give every rank the same "
                            "prepared dataset (copy the directory), and the same job file and --set options"
                          : "start every rank with the same job file and --set options");
}

std::vector<std::vector<int64_t>> committed_by_rank(const RunCheckpoints& ckpts, int world, const std::vector<int>& local,
                                                    comm::Communicator* process_comm) {
  std::vector<std::vector<int64_t>> all(static_cast<size_t>(world));
  for (int r : local) all[r] = ckpts.committed(r);
  if (process_comm == nullptr || world == 1) return all;
  // Row r holds rank r's steps + 1 (0 = none); other ranks contribute zeros, so the mean times
  // world is each row exactly (integers far below 2^53).
  auto t = torch::zeros({world, 2}, torch::kFloat64);
  for (int r : local)
    for (size_t k = 0; k < all[r].size() && k < 2; ++k) t[r][static_cast<int64_t>(k)] = static_cast<double>(all[r][k] + 1);
  process_comm->all_reduce_mean(t);
  t.mul_(world).round_();
  for (int r = 0; r < world; ++r) {
    all[r].clear();
    for (int k = 0; k < 2; ++k)
      if (const auto v = static_cast<int64_t>(t[r][k].item<double>()); v > 0) all[r].push_back(v - 1);
  }
  return all;
}

}  // namespace gasloc::train

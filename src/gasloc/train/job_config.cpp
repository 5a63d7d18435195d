#include "gasloc/train/job_config.hpp"

#include <fmt/format.h>

#include <cmath>

#include "gasloc/core/config.hpp"

namespace gasloc::train {
using config::require;

model::LlamaConfig ModelSection::resolve(int64_t vocab_size) const {
  model::LlamaConfig c = model::LlamaConfig::preset(preset);
  auto pick = [](auto& dst, auto v) {
    if (v > 0) dst = v;
  };
  pick(c.dim, dim);
  pick(c.n_layers, n_layers);
  pick(c.n_heads, n_heads);
  pick(c.n_kv_heads, n_kv_heads);
  pick(c.multiple_of, multiple_of);
  pick(c.ffn_dim_multiplier, ffn_dim_multiplier);
  pick(c.max_seq_len, max_seq_len);
  pick(c.vocab_size, vocab_size);
  c.rope_theta = rope_theta;
  c.tie_embeddings = tie_embeddings;
  c.init_std = init_std;
  c.validate();
  return c;
}

void to_json(nlohmann::json& j, const GpaFromDiloco& g) { j = {{"H", g.H}, {"mu", g.mu}}; }

void from_json(const nlohmann::json& j, GpaFromDiloco& g) {
  const std::string key = "optim.gpa_from_diloco";
  if (!j.is_object()) throw ConfigError("config key '" + key + "' expects a table { H = 32, mu = 0.9 }, got " + j.dump());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "H") config::detail::assign(key + ".H", it.value(), g.H);
    else if (it.key() == "mu") config::detail::assign(key + ".mu", it.value(), g.mu);
    else throw ConfigError("unknown config key '" + key + "." + it.key() + "'", "valid keys in " + key + ": H, mu");
  }
}

void OptimSection::resolve() {
  if (gpa_from_diloco.H <= 0) return;
  require(gpa_from_diloco.mu > 0 && gpa_from_diloco.mu < 1, "optim.gpa_from_diloco.mu", "must be in (0, 1)");
  const OptimSection defaults;
  const double mx = std::pow(gpa_from_diloco.mu, 1.0 / static_cast<double>(gpa_from_diloco.H));
  const double my = gpa_from_diloco.mu;
  // A value equal to the default or to the derived one was not set against the helper.
  require(mu_x == defaults.mu_x || mu_x == mx, "optim.mu_x",
          fmt::format("{} conflicts with optim.gpa_from_diloco, which sets it to {}; set only one of them", mu_x, mx));
  require(mu_y == defaults.mu_y || mu_y == my, "optim.mu_y",
          fmt::format("{} conflicts with optim.gpa_from_diloco, which sets it to {}; set only one of them", mu_y, my));
  mu_x = mx;
  mu_y = my;
}

void JobConfig::validate() const {
  model.resolve(0);  // preset known and shape consistent
  for (auto [k, v] : {std::pair{"dim", model.dim}, {"n_layers", model.n_layers}, {"n_heads", model.n_heads},
                      {"n_kv_heads", model.n_kv_heads}, {"max_seq_len", model.max_seq_len}})
    require(v >= 0, std::string("model.") + k, "must be >= 0 (0 = preset's)");
  require(model.rope_theta > 0, "model.rope_theta", "must be positive");
  require(model.init_std > 0, "model.init_std", "must be positive");

  require(!data.dir.empty(), "data.dir", "must name a dataset directory");
  require(data.seq_len > 0, "data.seq_len", "must be positive");
  const int64_t max_seq = model.resolve(0).max_seq_len;
  require(data.seq_len <= max_seq, "data.seq_len",
          fmt::format("{} exceeds the model's max_seq_len {} (raise model.max_seq_len or lower data.seq_len)",
                      data.seq_len, max_seq));
  require(data.batch_size > 0, "data.batch_size", "must be positive");
  require(data.val_batches > 0, "data.val_batches", "must be positive");
  require(data.vocab_size >= 0 && data.vocab_size <= 65536, "data.vocab_size", "must be in [0, 65536]");

  require(optim.name == "adamw" || optim.name == "gpa" || optim.name == "schedule_free", "optim.name",
          "unknown optimizer '" + optim.name + "'; valid: adamw, gpa, schedule_free");
  require(optim.mu_y > 0 && optim.mu_y <= 1, "optim.mu_y", fmt::format("must be in (0, 1], got {}", optim.mu_y));
  require(optim.mu_x >= 0 && optim.mu_x <= 1, "optim.mu_x", fmt::format("must be in [0, 1], got {}", optim.mu_x));
  require(optim.decay_on == "z" || optim.decay_on == "y", "optim.decay_on", "must be z or y, got '" + optim.decay_on + "'");
  require(optim.gpa_from_diloco.H >= 0, "optim.gpa_from_diloco.H", "must be >= 0 (0 = off)");
  require(optim.gpa_from_diloco.H == 0 || optim.name == "gpa", "optim.gpa_from_diloco",
          "applies to optim.name = \"gpa\" only, not '" + optim.name + "'");
  require(optim.lr > 0, "optim.lr", "must be positive");
  require(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1", "must be in [0, 1)");
  require(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2", "must be in [0, 1)");
  require(optim.eps > 0, "optim.eps", "must be positive");
  require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0");
  require(optim.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)");
  require(optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0");
  require(optim.decay == "cosine" || optim.decay == "linear" || optim.decay == "constant", "optim.decay",
          "must be cosine, linear or constant, got '" + optim.decay + "'");
  require(optim.min_lr_ratio >= 0 && optim.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]");

  require(train.steps > 0, "train.steps", "must be positive");
  require(train.stop_at >= 0 && train.stop_at <= train.steps, "train.stop_at", "must be in [0, train.steps]");
  require(train.eval_every >= 0, "train.eval_every", "must be >= 0");
  require(train.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0");
  require(train.log_every > 0, "train.log_every", "must be positive");
  require(train.device == "cpu" || train.device == "cuda", "train.device", "must be cpu or cuda, got '" + train.device + "'");
  require(train.dtype == "fp32" || train.dtype == "bf16", "train.dtype", "must be fp32 or bf16, got '" + train.dtype + "'");
  require(train.threads >= 0, "train.threads", "must be >= 0");
  require(!train.run_dir.empty(), "train.run_dir", "must not be empty");
  require(cluster.workers >= 1 && cluster.workers <= 4096, "cluster.workers", "must be in [1, 4096]");
  require(cluster.backend == "inproc" || cluster.backend == "gloo", "cluster.backend",
          "must be inproc or gloo, got '" + cluster.backend + "'");
  require(cluster.timeout_s > 0, "cluster.timeout_s", "must be positive");
  // Under gloo the world size is known only once the processes meet (WORLD_SIZE).
  algo.validate(cluster.backend == "inproc" ? static_cast<int>(cluster.workers) : 0);
}

nlohmann::json JobConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for_each_section([&](const char* name, const auto& s) { j[name] = config::to_json(s); });
  return j;
}

JobConfig job_from_json(const nlohmann::json& doc, const std::vector<std::string>& overrides) {
  JobConfig job;
  if (!doc.is_object()) throw ConfigError("the job file must be a TOML document of [sections]");
  std::string names;
  job.for_each_section([&](const char* name, auto&) { names += (names.empty() ? "" : ", ") + std::string(name); });
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    bool found = false;
    job.for_each_section([&](const char* name, auto& s) {
      if (it.key() != name) return;
      config::apply_table(s, name, it.value());
      found = true;
    });
    if (!found) throw ConfigError("unknown config section '" + it.key() + "'", "valid sections: " + names);
  }
  for (const auto& ov : overrides) {
    const auto eq = ov.find('=');
    const auto dot = ov.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
      throw ConfigError("bad override '" + ov + "'", "write --set section.key=value, e.g. --set optim.lr=1e-3");
    const std::string section = ov.substr(0, dot), key = ov.substr(dot + 1, eq - dot - 1), value = ov.substr(eq + 1);
    bool section_found = false, key_found = false;
    job.for_each_section([&](const char* name, auto& s) {
      if (section != name) return;
      section_found = true;
      key_found = config::apply_override(s, section, key, value);
    });
    if (!section_found) throw ConfigError("unknown config section '" + section + "' in --set " + ov, "valid sections: " + names);
    if (!key_found) {
      std::string keys;
      job.for_each_section([&](const char* name, auto& s) {
        if (section == name)
          for (const auto& f : config::describe(s, name)) keys += (keys.empty() ? "" : ", ") + f.key;
      });
      throw ConfigError("unknown config key '" + section + "." + key + "' in --set " + ov, "valid keys: " + keys);
    }
  }
  job.optim.resolve();
  job.validate();
  return job;
}

JobConfig load_job(const std::string& path, const std::vector<std::string>& overrides) {
  return job_from_json(path.empty() ? nlohmann::json::object() : config::parse_toml_file(path), overrides);
}

std::string describe_job() {
  JobConfig job;
  std::string out;
  job.for_each_section([&](const char* name, auto& s) {
    out += fmt::format("[{}]\n", name);
    for (const auto& f : config::describe(s, name))
      out += fmt::format("  {:<28} {:<7} {:<16} {}\n", f.key, f.type, f.value.dump(), f.doc);
  });
  return out;
}

}  // namespace gasloc::train

#include "gasloc/study/runs_csv.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "gasloc/core/error.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kCsvColumns = {"train_loss", "val_loss",   "consensus_distance", "lr",
                                              "grad_norm",  "computed",   "round_done",         "tokens_per_s",
                                              "local_steps", "wall_time_s", "virtual_time_s",   "bytes_sent",
                                              "idle_s"};

namespace {
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}
std::string csv_value(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return csv_cell(v.get<std::string>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) ? fmt::format("{}", d) : std::string();  // fmt: shortest round-trip form
  }
  return v.dump();  // integers, true/false
}
}  // namespace

std::string runs_csv(const std::vector<std::string>& dirs, const std::vector<std::string>& labels) {
  std::string out = "run,event,worker,step";
  for (const auto& c : kCsvColumns) out += "," + c;
  out += "\n";
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::ifstream in(fs::path(dirs[i]) / "metrics.jsonl");
    if (!in) throw DataError("no metrics.jsonl in '" + dirs[i] + "'", "is it a gasloc run directory?");
    const std::string run = csv_cell(labels.at(i));
    std::string line;
    while (std::getline(in, line)) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      const std::string event = j.value("event", "");
      if (event != "train" && event != "eval") continue;
      auto row = [&](const std::string& ev, const std::string& worker, const json& values) {
        out += run + "," + ev + "," + worker + "," + csv_value(j.value("step", json(nullptr)));
        for (const auto& c : kCsvColumns) out += "," + (values.contains(c) ? csv_value(values[c]) : std::string());
        out += "\n";
      };
      if (event == "train") {
        row("train", csv_value(j.value("worker", json(nullptr))), j);
        continue;
      }
      row("eval", "", j);
      const json own = j.value("worker_val_loss", json::array());
      for (size_t w = 0; own.is_array() && w < own.size(); ++w)
        row("eval_worker", std::to_string(w), {{"val_loss", own[w]}});
    }
  }
  return out;
}

}  // namespace gasloc::study

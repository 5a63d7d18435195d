#include "gasloc/study/runs_csv.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "gasloc/core/error.hpp"
#include "gasloc/train/metrics.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kCsvColumns = {"train_loss", "val_loss",   "consensus_distance", "lr",
                                              "grad_norm",  "computed",   "round_done",         "tokens_per_s",
                                              "local_steps", "wall_time_s", "virtual_time_s",   "bytes_sent",
                                              "idle_s",     "compute_s",  "utilization",      "eval_time_s"};

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text, const std::string& where) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string cell;
  bool quoted = false, any = false;  // any: the row has begun
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') cell += c;
      else if (i + 1 < text.size() && text[i + 1] == '"') cell += text[++i];
      else quoted = false;
      continue;
    }
    any = true;
    if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      row.push_back(std::move(cell));
      cell.clear();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      row.push_back(std::move(cell));
      cell.clear();
      rows.push_back(std::move(row));
      row.clear();
      any = false;
    } else {
      cell += c;
    }
  }
  if (quoted) throw DataError("'" + where + "' ends inside a quoted cell", "is the file cut short? regenerate it");
  if (any) {
    row.push_back(std::move(cell));
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {
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
    const std::string run = csv_cell(labels.at(i));
    // Each event's columns are its line's fields (train/metrics.hpp), absent ones left empty.
    auto row = [&](const std::string& ev, const std::string& worker, int64_t step, const json& values) {
      out += run + "," + ev + "," + worker + "," + std::to_string(step);
      for (const auto& c : kCsvColumns) out += "," + (values.contains(c) ? csv_value(values[c]) : std::string());
      out += "\n";
    };
    for (const auto& event : train::read_metrics(dirs[i])) {
      if (const auto* t = std::get_if<train::TrainEvent>(&event)) {
        row("train", std::to_string(t->worker), t->step, train::to_json(event));
      } else if (const auto* e = std::get_if<train::EvalEvent>(&event)) {
        row("eval", "", e->step, train::to_json(event));
        // An elastic run's own-model losses are in its members' order, not by id.
        for (size_t w = 0; w < e->worker_val_loss.size(); ++w)
          row("eval_worker", std::to_string(e->members.empty() ? static_cast<int64_t>(w) : e->members.at(w)), e->step,
              {{"val_loss", e->worker_val_loss[w]}});
      }
    }
  }
  return out;
}

}  // namespace gasloc::study

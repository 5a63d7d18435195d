#include "gasloc/core/config.hpp"

#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include <filesystem>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/shipped_files.hpp"

namespace gasloc::config {
namespace {

json to_json_node(const toml::node& node) {
  if (auto* t = node.as_table()) {
    json j = json::object();
    for (auto&& [k, v] : *t) j[std::string(k.str())] = to_json_node(v);
    return j;
  }
  if (auto* a = node.as_array()) {
    json j = json::array();
    for (auto&& v : *a) j.push_back(to_json_node(v));
    return j;
  }
  if (auto* v = node.as_string()) return v->get();
  if (auto* v = node.as_integer()) return v->get();
  if (auto* v = node.as_floating_point()) return v->get();
  if (auto* v = node.as_boolean()) return v->get();
  throw ConfigError("dates and times are not valid setting values (at " +
                    std::string(node.source().path ? *node.source().path : "config") + ":" +
                    std::to_string(node.source().begin.line) + ")");
}

json parse(std::string_view text, const std::string& source) {
  try {
    toml::table tbl = toml::parse(text, source);
    return to_json_node(tbl);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(source + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                          ": " + std::string(e.description()),
                      "the job file must be valid TOML (https://toml.io)");
  }
}
}  // namespace

json parse_toml_text(std::string_view text, const std::string& source_name) {
  return parse(text, source_name);
}

json parse_toml_file(const std::string& path) {
  // A job file is a few KB; the cap turns a data file given by mistake into an error instead of
  // a read that fills memory (read_file refuses a FIFO or device such as /dev/zero).
  constexpr size_t kMaxJobFileBytes = 1 << 20;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError("cannot open config file '" + path + "'", "check the path given to --config; " + shipped_hint());
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("config file '" + path + "' is a directory", "give --config the path of a TOML job file, e.g. configs/tiny.toml");
  std::string text;
  try {
    text = read_file(path, kMaxJobFileBytes);
  } catch (const Error& e) {
    throw ConfigError(std::string("config file: ") + e.what(), "give --config the path of a TOML job file (at most 1 MiB)");
  }
  return parse(text, path);
}

}  // namespace gasloc::config

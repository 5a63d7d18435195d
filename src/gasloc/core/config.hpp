// Typed configuration sections (torchtitan style): each component owns a plain struct whose
// fields carry their defaults, and a `visit` member that names every field with a one-line doc:
//
//   struct OptimConfig {
//     double lr = 3e-3;
//     template <class V> void visit(V&& v) { v("lr", lr, "peak learning rate"); }
//   };
//
// From that single list this header derives loading from a parsed TOML table, `--set
// section.key=value` overrides, JSON for run.json, and the documentation table. Unknown keys
// and mistyped values throw ConfigError naming the full key.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gasloc/core/choice.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::config {

using json = nlohmann::json;

// Parses a TOML file into JSON (tables -> objects, arrays -> arrays). Throws ConfigError with
// the file, line and column on a syntax error.
json parse_toml_file(const std::string& path);
// Parses TOML text (used by tests and by --set values such as arrays and inline tables).
json parse_toml_text(std::string_view text, const std::string& source_name);

struct FieldInfo {
  std::string key;   // section.key
  std::string type;  // bool, int, float, string, or json
  std::string doc;
  json value;
};

namespace detail {

template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "int";
  else if constexpr (std::is_floating_point_v<T>) return "float";
  else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, Choice>) return "string";
  else return "json";
}

template <class T>
void assign(const std::string& key, const json& j, T& out) {
  auto bad = [&](const char* expected) {
    throw ConfigError("config key '" + key + "' expects " + expected + ", got " + j.dump(),
                      "fix the value of '" + key + "' in the job file or --set");
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) bad("true or false");
    out = j.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    // A float is refused even when whole (1e3): an integer key written as a float is more often a
    // typo for another key than a count, and TOML writes integers without a point.
    if (!j.is_number_integer()) bad("an integer (write it without a decimal point or exponent, e.g. 1000)");
    out = static_cast<T>(j.get<int64_t>());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) bad("a number");
    out = j.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) bad("a string");
    out = j.get<std::string>();
  } else if constexpr (std::is_same_v<T, Choice>) {
    if (!j.is_string()) bad(("one of " + out.choices().names()).c_str());
    out.assign(key, j.get<std::string>());
  } else {
    try {
      out = j.get<T>();
    } catch (const json::exception& e) {
      throw ConfigError("config key '" + key + "': " + e.what());
    }
  }
}

// Turns the text of `--set key=text` into JSON for a field of type T: strings are taken
// verbatim (quotes optional), everything else is parsed as a TOML value.
template <class T>
json text_to_json(const std::string& key, std::string_view text) {
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, Choice>) {
    std::string s(text);
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
      s = s.substr(1, s.size() - 2);
    return s;
  } else {
    json doc;
    try {
      doc = parse_toml_text("v = " + std::string(text), "--set " + key);
    } catch (const ConfigError&) {
      throw ConfigError("cannot parse value '" + std::string(text) + "' for config key '" + key +
                            "' (expects " + type_name<T>() + ")",
                        "write --set " + key + "=VALUE with a valid value");
    }
    return doc.at("v");
  }
}

}  // namespace detail

// Sets the fields of `s` from the JSON object `table` (one TOML section). Keys not declared by
// the section are an error that lists the valid ones.
template <class Section>
void apply_table(Section& s, const std::string& section, const json& table) {
  if (!table.is_object())
    throw ConfigError("config section '" + section + "' must be a table, got " + table.dump());
  std::set<std::string> known;
  s.visit([&](const char* key, auto& field, const char*) {
    known.insert(key);
    auto it = table.find(key);
    if (it != table.end()) detail::assign(section + "." + key, *it, field);
  });
  for (auto it = table.begin(); it != table.end(); ++it) {
    if (!known.count(it.key())) {
      std::string valid;
      for (const auto& k : known) valid += (valid.empty() ? "" : ", ") + k;
      throw ConfigError("unknown config key '" + section + "." + it.key() + "'",
                        "valid keys in [" + section + "]: " + valid);
    }
  }
}

// Applies one override `key=text` to a section; returns false if the section has no such key.
template <class Section>
bool apply_override(Section& s, const std::string& section, const std::string& key,
                    std::string_view text) {
  bool found = false;
  s.visit([&](const char* name, auto& field, const char*) {
    if (key != name) return;
    using T = std::decay_t<decltype(field)>;
    const std::string full = section + "." + key;
    detail::assign(full, detail::text_to_json<T>(full, text), field);
    found = true;
  });
  return found;
}

template <class Section>
json to_json(const Section& s) {
  json j = json::object();
  const_cast<Section&>(s).visit([&](const char* key, auto& field, const char*) { j[key] = field; });
  return j;
}

template <class Section>
std::vector<FieldInfo> describe(const Section& s, const std::string& section) {
  std::vector<FieldInfo> out;
  const_cast<Section&>(s).visit([&](const char* key, auto& field, const char* doc) {
    using T = std::decay_t<decltype(field)>;
    std::string text = doc;
    if constexpr (std::is_same_v<T, Choice>) text += ": " + field.choices().describe();
    out.push_back({section + "." + key, detail::type_name<T>(), text, json(field)});
  });
  return out;
}

// Helpers for validate(): throw ConfigError naming the key when a check fails.
inline void require(bool ok, const std::string& key, const std::string& msg) {
  if (!ok) throw ConfigError("config key '" + key + "': " + msg, "fix '" + key + "' in the job file or --set");
}

}  // namespace gasloc::config

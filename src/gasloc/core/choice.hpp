// Enumerated settings (algo.name, train.dtype, algo.topology, ...). Each setting's valid names
// are spelled once, in a Choices list owned by the layer that gives them meaning (a registry,
// an enum's table); config loading, error messages and `--help-config` all read that list.
//
//   const config::Choices& dtypes() { static const config::Choices c("dtype", {{"fp32", ""}, {"bf16", "autocast"}}); return c; }
//   struct TrainConfig { config::Choice dtype{dtypes(), "fp32"}; ... };
//
// A Choice reads and writes as its name, so job files and run.json are plain strings.
#pragma once
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace gasloc::config {

// One valid value and what it means (may be empty).
struct Option {
  std::string name;
  std::string doc;
};

class Choices {
 public:
  // `what` names the setting in errors: "unknown <what> 'x'; valid: a, b".
  Choices(std::string what, std::vector<Option> options);
  const std::string& what() const { return what_; }
  const std::vector<Option>& options() const { return options_; }
  bool contains(std::string_view name) const;
  // The position of `name` in the list; otherwise ConfigError, its hint listing the valid names.
  size_t index(std::string_view name) const;
  std::string names() const;     // "a, b, c"
  std::string describe() const;  // "a (its doc), b, c (its doc)" for --help-config

 private:
  std::string what_;
  std::vector<Option> options_;
};

// A setting whose value is one of its Choices. Comparing it with a name that is not one of
// them is a bug in the caller (a misspelt literal) and throws std::logic_error, so that such a
// comparison fails the first test that reaches it instead of being silently false.
class Choice {
 public:
  // `value` must be one of `choices` (std::logic_error otherwise: a wrong default is a bug).
  Choice(const Choices& choices, std::string_view value);
  const std::string& str() const { return value_; }
  operator const std::string&() const { return value_; }
  const Choices& choices() const { return *choices_; }
  size_t index() const { return choices_->index(value_); }
  // Sets a value chosen in code (std::logic_error if it is not one of the choices).
  Choice& operator=(std::string_view value);
  // Sets the value read for config key `key`; ConfigError naming the key and listing the
  // valid names if it is not one of them.
  void assign(const std::string& key, const std::string& value);

  bool operator==(std::string_view name) const;
  bool operator==(const Choice& other) const { return value_ == other.value_; }

 private:
  const Choices* choices_;
  std::string value_;
};

// The Choices of a registry (a table of entries with a name and a doc), in its order.
template <class Entry>
Choices choices_of(std::string what, const std::vector<Entry>& entries) {
  std::vector<Option> options;
  for (const auto& e : entries) options.push_back({e.name, e.doc});
  return Choices(std::move(what), std::move(options));
}

// "a, b": the names of the entries whose `flag` is `value` (help texts and errors).
template <class Entry>
std::string names_where(const std::vector<Entry>& entries, bool Entry::*flag, bool value = true) {
  std::string out;
  for (const auto& e : entries)
    if (e.*flag == value) out += (out.empty() ? "" : ", ") + e.name;
  return out;
}

inline void to_json(nlohmann::json& j, const Choice& c) { j = c.str(); }
inline std::ostream& operator<<(std::ostream& os, const Choice& c) { return os << c.str(); }

}  // namespace gasloc::config

template <>
struct fmt::formatter<gasloc::config::Choice> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const gasloc::config::Choice& c, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(c.str(), ctx);
  }
};

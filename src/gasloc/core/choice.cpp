#include "gasloc/core/choice.hpp"

#include <stdexcept>

#include "gasloc/core/error.hpp"

namespace gasloc::config {

Choices::Choices(std::string what, std::vector<Option> options) : what_(std::move(what)), options_(std::move(options)) {}

bool Choices::contains(std::string_view name) const {
  for (const auto& o : options_)
    if (o.name == name) return true;
  return false;
}

size_t Choices::index(std::string_view name) const {
  for (size_t i = 0; i < options_.size(); ++i)
    if (options_[i].name == name) return i;
  throw ConfigError("unknown " + what_ + " '" + std::string(name) + "'", "valid: " + names());
}

std::string Choices::names() const {
  std::string out;
  for (const auto& o : options_) out += (out.empty() ? "" : ", ") + o.name;
  return out;
}

std::string Choices::describe() const {
  std::string out;
  for (const auto& o : options_)
    out += (out.empty() ? "" : ", ") + o.name + (o.doc.empty() ? "" : " (" + o.doc + ")");
  return out;
}

Choice::Choice(const Choices& choices, std::string_view value) : choices_(&choices), value_(value) {
  if (!choices.contains(value))
    throw std::logic_error("'" + value_ + "' is not a " + choices.what() + " (" + choices.names() + ")");
}

Choice& Choice::operator=(std::string_view value) {
  *this = Choice(*choices_, value);
  return *this;
}

void Choice::assign(const std::string& key, const std::string& value) {
  if (!choices_->contains(value))
    throw ConfigError("config key '" + key + "': unknown " + choices_->what() + " '" + value + "'; valid: " + choices_->names(),
                      "fix '" + key + "' in the job file or --set");
  value_ = value;
}

bool Choice::operator==(std::string_view name) const {
  if (!choices_->contains(name))
    throw std::logic_error("comparing a " + choices_->what() + " with '" + std::string(name) + "', which is none of " +
                           choices_->names());
  return value_ == name;
}

}  // namespace gasloc::config

// Errors that reach the user. Library code throws these; only main() turns them into an exit
// code. Each carries a hint that says what to do about it (llm.c's HINT lines).
#pragma once
#include <stdexcept>
#include <string>

namespace gasloc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {})
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// A setting that is unknown, mistyped or out of range. The message names the key.
class ConfigError : public Error {
  using Error::Error;
};
// Input data that is missing, corrupt or unusable (corpora, shards, tokenizers).
class DataError : public Error {
  using Error::Error;
};
// A checkpoint or weight file that cannot be read or written.
class CheckpointError : public Error {
  using Error::Error;
};
// A peer or transport failure: a timeout, a dead or misbehaving rank. `failed_rank` is the rank
// that failed first as far as this rank could tell (-1: unknown), which is not always the peer
// this rank was talking to: a rank that fails closes its connections and makes its own peers
// fail after it.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what, std::string hint = {}, int failed_rank = -1)
      : Error(what, std::move(hint)), failed_rank_(failed_rank) {}
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_ = -1;
};

}  // namespace gasloc

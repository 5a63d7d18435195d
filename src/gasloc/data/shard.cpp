#include "gasloc/data/shard.hpp"

#include <bit>
#include <cstring>
#include <fstream>
#include <string>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;

// The format is little-endian on disk; we copy raw memory, so refuse to build elsewhere
// rather than silently writing byte-swapped shards.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes a little-endian host");

std::string encode_shard(const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw DataError("shard of " + std::to_string(tokens.size()) + " tokens exceeds the int32 token count of the llm.c header",
                    "split the tokens into several shards");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(kShardHeaderBytes + tokens.size() * sizeof(uint16_t), '\0');
  std::memcpy(bytes.data(), header, kShardHeaderBytes);
  if (!tokens.empty()) std::memcpy(bytes.data() + kShardHeaderBytes, tokens.data(), tokens.size() * sizeof(uint16_t));
  return bytes;
}

void write_shard(const fs::path& path, const std::vector<uint16_t>& tokens) {
  write_file_atomic(path, encode_shard(tokens));
}

std::vector<uint16_t> read_shard(const fs::path& path, int64_t vocab_size) {
  const std::string name = "token shard '" + path.string() + "'";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw DataError(name + " does not exist", "check the path, or create shards with `gasloc prepare`");
  const auto file_bytes = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) throw DataError("cannot stat " + name + ": " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open " + name, "check the file's permissions");

  if (file_bytes < kShardHeaderBytes)
    throw DataError(name + " is " + std::to_string(file_bytes) + " bytes, shorter than the " +
                        std::to_string(kShardHeaderBytes) + "-byte llm.c header",
                    "the file is truncated or not a token shard; recreate it with `gasloc prepare`");
  int32_t header[kShardHeaderInts];
  in.read(reinterpret_cast<char*>(header), kShardHeaderBytes);
  if (header[0] != kShardMagic)
    throw DataError(name + " has bad magic number: expected " + std::to_string(kShardMagic) + ", got " +
                        std::to_string(header[0]),
                    "this is not an llm.c token shard (uint16 tokens after a 256-int32 header); "
                    "create shards with `gasloc prepare` or llm.c's dataset scripts");
  if (header[1] != kShardVersion)
    throw DataError(name + " has unsupported version " + std::to_string(header[1]) + " (supported: " +
                        std::to_string(kShardVersion) + ")",
                    "version 2 and later hold other token widths; re-export the shard with uint16 tokens (version 1)");
  const int64_t count = header[2];
  const int64_t body = file_bytes - kShardHeaderBytes;
  if (count < 0 || body != count * 2)
    throw DataError(name + " is truncated or corrupt: header says " + std::to_string(count) + " tokens (" +
                        std::to_string(count * 2) + " bytes) but " + std::to_string(body) + " bytes follow the header",
                    "the file was cut short (interrupted copy or download?); recreate or re-download it");

  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(tokens.data()), body);
  if (in.gcount() != body) throw DataError("cannot read " + name + ": short read", "check the disk and the file");

  if (vocab_size > 0) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= vocab_size)
        throw DataError(name + " has token id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                            ", which is >= the vocabulary size " + std::to_string(vocab_size),
                        "the shard was made with a different tokenizer; re-prepare the data or set the model's "
                        "vocab size to match the tokenizer");
    }
  }
  return tokens;
}

}  // namespace gasloc::data

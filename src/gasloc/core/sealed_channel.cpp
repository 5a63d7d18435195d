// A sealed channel; see sealed_channel.hpp.
#include "gasloc/core/sealed_channel.hpp"

#include <fmt/format.h>

#include <limits>

#include "gasloc/core/secret.hpp"

namespace gasloc {

namespace {
std::string length_prefixed(const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  std::string out = {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n)};
  return out + s;
}
}  // namespace

SealedChannel::SealedChannel(const std::string& secret, const std::string& salt, const std::string& job, std::string channel,
                             bool initiator)
    : channel_(std::move(channel)), initiator_(initiator) {
  if (secret.empty()) throw Error("a sealed channel needs the job's secret", "set cluster.secret_file");
  key_ = crypto::hkdf_sha256(secret, salt, "gasloc data" + length_prefixed(job) + channel_, 32);
}

std::string SealedChannel::nonce(bool mine, uint64_t count) const {
  const bool initiator_sent = mine == initiator_;
  std::string n(12, '\0');
  n[0] = initiator_sent ? '\0' : '\1';
  for (int b = 0; b < 8; ++b) n[4 + b] = static_cast<char>(count >> (56 - 8 * b));
  return n;
}

std::vector<uint8_t> SealedChannel::seal(std::span<const uint8_t> plaintext, std::span<const uint8_t> header) {
  std::vector<uint8_t> out(plaintext.size() + crypto::kGcmTagBytes);
  seal_into(plaintext, out, header);
  return out;
}

void SealedChannel::seal_into(std::span<const uint8_t> plaintext, std::span<uint8_t> out, std::span<const uint8_t> header) {
  if (sent_ == std::numeric_limits<uint64_t>::max())
    throw SealError(fmt::format("channel '{}': 2^64 messages sent; open a new channel", channel_));
  crypto::aes256gcm_seal(key_, nonce(true, sent_), header, plaintext, out);
  ++sent_;
}

std::vector<uint8_t> SealedChannel::open(std::span<const uint8_t> sealed, std::span<const uint8_t> header) {
  std::vector<uint8_t> out(sealed.size() < crypto::kGcmTagBytes ? 0 : sealed.size() - crypto::kGcmTagBytes);
  open_into(sealed, out, header);
  return out;
}

void SealedChannel::open_into(std::span<const uint8_t> sealed, std::span<uint8_t> out, std::span<const uint8_t> header) {
  if (sealed.size() < crypto::kGcmTagBytes)
    throw SealError(fmt::format("channel '{}': message {} from the peer is {} bytes, shorter than its tag", channel_,
                                received_, sealed.size()));
  if (!crypto::aes256gcm_open(key_, nonce(false, received_), header, sealed, out))
    throw SealError(fmt::format("channel '{}': message {} from the peer does not open (altered, replayed, reordered or "
                                "meant for another channel, run or direction)",
                                channel_, received_));
  ++received_;
}

}  // namespace gasloc

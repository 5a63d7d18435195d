// One channel of a job with a secret (docs/design.md section 13, docs/communication.md
// "Authenticated jobs"): the messages two ranks swap on it, sealed with AES-256-GCM under a key
// of the channel's own, so that what is recorded on one channel, one run or one direction opens
// on no other.
//
//   key    K_ch = HKDF-SHA256(secret, salt, "gasloc data" | len(job) | job | channel), 32 bytes;
//          salt: the store host's session salt, drawn anew at every start; channel: its name,
//          which holds both ends' (id, incarnation), its round and attempt (the caller's part).
//   nonce  (direction, counter): 1 byte, the sender's side (0 for the initiator, 1 for the
//          other), 3 zero bytes, then a 64-bit big-endian count of that side's messages. Each end
//          keeps both counts itself: nothing on the wire says which nonce to use, so a replayed,
//          reordered, reflected or misdirected message does not open.
//   aad    the caller's header (e.g. the transfer's tag and sizes), authenticated, not encrypted.
//
// A message that does not open is a SealError naming the channel; the receive count does not
// move, so a forged message injected in a stream does not desynchronize the honest one after it.
// A failed open is never evidence against the sender: anyone on the path can cause one.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gasloc/core/error.hpp"

namespace gasloc {

// A message that did not open on its channel. Not a failure of the peer it claims to come from
// (failed_rank() is -1): a network attacker can cause it.
class SealError : public CommError {
 public:
  explicit SealError(const std::string& what)
      : CommError(what, "an altered, replayed or misdirected message: nothing from it was used; if it repeats, look for "
                        "a peer with another cluster.secret_file, or something on the path rewriting traffic") {}
};

class SealedChannel {
 public:
  // Both ends build it with the same secret, salt, job and channel; exactly one is the initiator
  // (e.g. the lower id). Throws Error on an empty secret.
  SealedChannel(const std::string& secret, const std::string& salt, const std::string& job, std::string channel,
                bool initiator);

  // The next message to the peer: ciphertext || tag, plaintext.size() + 16 bytes.
  std::vector<uint8_t> seal(std::span<const uint8_t> plaintext, std::span<const uint8_t> header = {});
  // The peer's next message, opened with the header it was sealed with. Throws SealError naming
  // the channel when it does not open.
  std::vector<uint8_t> open(std::span<const uint8_t> sealed, std::span<const uint8_t> header = {});
  // The same two into the caller's memory (a transfer's buffers: nothing allocated). seal_into's
  // `out` has plaintext.size() + 16 bytes; open_into's has sealed.size() - 16, zeroed when the
  // message does not open.
  void seal_into(std::span<const uint8_t> plaintext, std::span<uint8_t> out, std::span<const uint8_t> header = {});
  void open_into(std::span<const uint8_t> sealed, std::span<uint8_t> out, std::span<const uint8_t> header = {});

  const std::string& name() const { return channel_; }
  uint64_t sent() const { return sent_; }
  uint64_t received() const { return received_; }

 private:
  std::string nonce(bool mine, uint64_t count) const;

  std::string channel_;
  std::string key_;
  bool initiator_;
  uint64_t sent_ = 0, received_ = 0;
};

}  // namespace gasloc

// A job's secret (cluster.secret_file, docs/communication.md "Authenticated jobs") and the few
// primitives of OpenSSL 3's libcrypto built on it: random bytes, HMAC-SHA256, HKDF-SHA256 and a
// constant-time comparison. Only holders of the secret take part in a job that has one.
//
// A secret file holds 64 hex characters (32 random bytes) and a newline; `gasloc secret --out
// FILE` writes one with mode 0600. Processes hand each other the file's path, never its content.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gasloc/core/error.hpp"

namespace gasloc {

// A peer that does not hold the job's secret, or a job whose members disagree on having one: a
// configuration mistake (exit 2; gasloc launch --elastic does not restart the rank), never a
// network fault to retry. The message names cluster.secret_file.
class AuthError : public ConfigError {
  using ConfigError::ConfigError;
};

constexpr size_t kSecretBytes = 32;

// The secret's bytes (at least kSecretBytes) from `path`. Throws ConfigError, saying the fix: a
// file that group or others may read or write (chmod 600 FILE), not a regular file, missing,
// not hex, or shorter than 64 hex characters.
std::string read_secret_file(const std::string& path);
// Writes a new random secret to `path` with mode 0600. Throws ConfigError when the file exists
// (a secret is never overwritten: ranks holding the old one would be locked out) or cannot be
// written.
void write_secret_file(const std::string& path);

namespace crypto {

// n bytes from OpenSSL's CSPRNG (RAND_bytes). Throws Error when it fails.
std::string random_bytes(size_t n);
// HMAC-SHA256 of `data` under `key`: 32 bytes.
std::string hmac_sha256(const std::string& key, const std::string& data);
// HKDF-SHA256 (RFC 5869) of `ikm` with `salt` and `info`: n bytes.
std::string hkdf_sha256(const std::string& ikm, const std::string& salt, const std::string& info, size_t n);
// a == b in time that does not depend on where they differ (CRYPTO_memcmp); false for sizes
// that differ.
bool equal(const std::string& a, const std::string& b);
// AES-256-GCM with a 16-byte tag. seal: out (in.size() + 16 bytes) = ciphertext || tag of `in`
// under a 32-byte key and a 12-byte nonce, with `aad` authenticated but not encrypted. open: the
// reverse into out (in.size() - 16 bytes); false, with out zeroed, when the tag does not verify
// (an altered ciphertext, aad, key or nonce). Throws Error on a key or nonce of the wrong size.
constexpr size_t kGcmTagBytes = 16;
void aes256gcm_seal(const std::string& key, const std::string& nonce, std::span<const uint8_t> aad,
                    std::span<const uint8_t> in, std::span<uint8_t> out);
bool aes256gcm_open(const std::string& key, const std::string& nonce, std::span<const uint8_t> aad,
                    std::span<const uint8_t> in, std::span<uint8_t> out);
std::string to_hex(const std::string& bytes);

}  // namespace crypto
}  // namespace gasloc

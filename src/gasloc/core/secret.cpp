#include "gasloc/core/secret.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace gasloc {

namespace {

// Every OpenSSL handle is owned by one of these.
struct MacFree {
  void operator()(EVP_MAC* p) const { EVP_MAC_free(p); }
};
struct MacCtxFree {
  void operator()(EVP_MAC_CTX* p) const { EVP_MAC_CTX_free(p); }
};
struct KdfFree {
  void operator()(EVP_KDF* p) const { EVP_KDF_free(p); }
};
struct KdfCtxFree {
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};
using Mac = std::unique_ptr<EVP_MAC, MacFree>;
using MacCtx = std::unique_ptr<EVP_MAC_CTX, MacCtxFree>;
using Kdf = std::unique_ptr<EVP_KDF, KdfFree>;
using KdfCtx = std::unique_ptr<EVP_KDF_CTX, KdfCtxFree>;
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

// OpenSSL's last error, for a message.
std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

[[noreturn]] void fail(const std::string& what) {
  throw Error(fmt::format("libcrypto: {} failed: {}", what, openssl_error()),
              "OpenSSL 3's libcrypto (Debian libssl3) must be installed and working");
}

// Fetched once; an EVP_MAC is shared by every thread's contexts.
EVP_MAC* hmac() {
  static const Mac mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) fail("fetching HMAC");
  return mac.get();
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

const char* const kWriteHint = "write one with: gasloc secret --out FILE (then copy it to every host, mode 0600)";

}  // namespace

namespace crypto {

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) fail("RAND_bytes");
  return out;
}

std::string hmac_sha256(const std::string& key, const std::string& data) {
  MacCtx ctx(EVP_MAC_CTX_new(hmac()));
  if (!ctx) fail("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) != 1)
    fail("HMAC init");
  if (EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1) fail("HMAC update");
  std::string out(32, '\0');
  size_t len = 0;
  if (EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) != 1 || len != 32)
    fail("HMAC final");
  return out;
}

std::string hkdf_sha256(const std::string& ikm, const std::string& salt, const std::string& info, size_t n) {
  const Kdf kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (!kdf) fail("fetching HKDF");
  KdfCtx ctx(EVP_KDF_CTX_new(kdf.get()));
  if (!ctx) fail("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  std::vector<OSSL_PARAM> params;
  params.push_back(OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0));
  params.push_back(OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(ikm.data()), ikm.size()));
  if (!salt.empty())
    params.push_back(OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size()));
  params.push_back(OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()), info.size()));
  params.push_back(OSSL_PARAM_construct_end());
  std::string out(n, '\0');
  if (EVP_KDF_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), n, params.data()) != 1) fail("HKDF");
  return out;
}

bool equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

namespace {

// EVP takes int lengths: a payload moves through it in pieces of at most 1 GiB.
constexpr size_t kPiece = size_t{1} << 30;

CipherCtx gcm_context(const std::string& key, const std::string& nonce, bool encrypt) {
  if (key.size() != 32 || nonce.size() != 12)
    throw Error(fmt::format("AES-256-GCM needs a 32-byte key and a 12-byte nonce, not {} and {}", key.size(), nonce.size()));
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (!ctx) fail("EVP_CIPHER_CTX_new");
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  const auto* iv = reinterpret_cast<const unsigned char*>(nonce.data());
  const int ok = encrypt ? EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, k, iv)
                         : EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, k, iv);
  if (ok != 1) fail("AES-256-GCM init");
  return ctx;
}

}  // namespace

void aes256gcm_seal(const std::string& key, const std::string& nonce, std::span<const uint8_t> aad, std::span<const uint8_t> in,
                    std::span<uint8_t> out) {
  if (out.size() != in.size() + kGcmTagBytes)
    throw Error(fmt::format("AES-256-GCM seal: {} bytes of output for {} of input (needs {})", out.size(), in.size(),
                            in.size() + kGcmTagBytes));
  const CipherCtx ctx = gcm_context(key, nonce, true);
  int len = 0;
  for (size_t at = 0; at < aad.size(); at += kPiece)
    if (EVP_EncryptUpdate(ctx.get(), nullptr, &len, aad.data() + at, static_cast<int>(std::min(kPiece, aad.size() - at))) != 1)
      fail("AES-256-GCM aad");
  size_t written = 0;
  for (size_t at = 0; at < in.size(); at += kPiece) {
    if (EVP_EncryptUpdate(ctx.get(), out.data() + written, &len, in.data() + at,
                          static_cast<int>(std::min(kPiece, in.size() - at))) != 1)
      fail("AES-256-GCM encrypt");
    written += static_cast<size_t>(len);
  }
  if (EVP_EncryptFinal_ex(ctx.get(), out.data() + written, &len) != 1) fail("AES-256-GCM final");
  written += static_cast<size_t>(len);
  if (written != in.size()) fail("AES-256-GCM length");
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kGcmTagBytes), out.data() + written) != 1)
    fail("AES-256-GCM tag");
}

bool aes256gcm_open(const std::string& key, const std::string& nonce, std::span<const uint8_t> aad, std::span<const uint8_t> in,
                    std::span<uint8_t> out) {
  if (in.size() < kGcmTagBytes || out.size() != in.size() - kGcmTagBytes) {
    std::fill(out.begin(), out.end(), uint8_t{0});
    return false;
  }
  const size_t n = in.size() - kGcmTagBytes;
  const CipherCtx ctx = gcm_context(key, nonce, false);
  int len = 0;
  bool ok = true;
  for (size_t at = 0; ok && at < aad.size(); at += kPiece)
    ok = EVP_DecryptUpdate(ctx.get(), nullptr, &len, aad.data() + at, static_cast<int>(std::min(kPiece, aad.size() - at))) == 1;
  size_t written = 0;
  for (size_t at = 0; ok && at < n; at += kPiece) {
    ok = EVP_DecryptUpdate(ctx.get(), out.data() + written, &len, in.data() + at, static_cast<int>(std::min(kPiece, n - at))) == 1;
    written += static_cast<size_t>(len);
  }
  std::array<uint8_t, kGcmTagBytes> tag;
  std::copy(in.begin() + static_cast<std::ptrdiff_t>(n), in.end(), tag.begin());
  ok = ok && EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kGcmTagBytes), tag.data()) == 1;
  ok = ok && EVP_DecryptFinal_ex(ctx.get(), out.data() + written, &len) == 1;
  ERR_clear_error();  // a tag that does not verify leaves nothing worth keeping in OpenSSL's queue
  if (!ok) std::fill(out.begin(), out.end(), uint8_t{0});
  return ok;
}

}  // namespace crypto

std::string read_secret_file(const std::string& path) {
  const std::string key = "cluster.secret_file";
  // O_NONBLOCK: a FIFO given as the secret is refused below instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    throw ConfigError(fmt::format("{}: cannot read the job's secret '{}': {}", key, path, std::strerror(errno)),
                      errno == ENOENT ? std::string(kWriteHint) : "check the path and its permissions");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw ConfigError(fmt::format("{}: '{}' is not a regular file (a FIFO, socket or device is refused)", key, path),
                      kWriteHint);
  if ((st.st_mode & 077) != 0)
    throw ConfigError(fmt::format("{}: the job's secret '{}' may be read or changed by other users (mode {:04o})", key, path,
                                  st.st_mode & 07777),
                      fmt::format("chmod 600 {}", path));
  std::string text(4096, '\0');
  size_t got = 0;
  for (;;) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(fmt::format("{}: cannot read '{}': {}", key, path, std::strerror(errno)));
    if (n == 0 || (got += static_cast<size_t>(n)) == text.size()) break;
  }
  text.resize(got);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (got == 4096 || text.size() % 2 != 0 ||
      std::any_of(text.begin(), text.end(), [](char c) { return hex_digit(c) < 0; }))
    throw ConfigError(fmt::format("{}: '{}' is not a gasloc secret (64 hex characters expected)", key, path), kWriteHint);
  if (text.size() < 2 * kSecretBytes)
    throw ConfigError(fmt::format("{}: the secret in '{}' is too short: {} hex characters, at least {} needed", key, path,
                                  text.size(), 2 * kSecretBytes),
                      kWriteHint);
  std::string secret(text.size() / 2, '\0');
  for (size_t i = 0; i < secret.size(); ++i)
    secret[i] = static_cast<char>(hex_digit(text[2 * i]) * 16 + hex_digit(text[2 * i + 1]));
  OPENSSL_cleanse(text.data(), text.size());
  return secret;
}

void write_secret_file(const std::string& path) {
  std::string secret = crypto::random_bytes(kSecretBytes);
  std::string text = crypto::to_hex(secret) + "\n";
  OPENSSL_cleanse(secret.data(), secret.size());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int e = errno;
    OPENSSL_cleanse(text.data(), text.size());
    if (e == EEXIST)
      throw ConfigError(fmt::format("secret: '{}' exists; a secret is never overwritten (ranks holding it would be locked "
                                    "out)",
                                    path),
                        "remove it first if you mean to replace it, or choose another path");
    throw ConfigError(fmt::format("secret: cannot create '{}': {}", path, std::strerror(e)));
  }
  bool ok = ::fchmod(fd, 0600) == 0;  // whatever the umask
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  const int e = errno;
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  OPENSSL_cleanse(text.data(), text.size());
  if (!ok) {
    ::unlink(path.c_str());
    throw ConfigError(fmt::format("secret: cannot write '{}': {}", path, std::strerror(e)));
  }
}

}  // namespace gasloc

// AES-256-GCM (core/secret.hpp) against the GCM specification's test vector, and the sealed
// channel (core/sealed_channel.hpp) against every way a message can be moved, replayed, altered
// or sent on the wrong channel: each must fail to open, and honest traffic must go on after it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gasloc/core/sealed_channel.hpp"
#include "gasloc/core/secret.hpp"

using namespace gasloc;

namespace {

std::vector<uint8_t> hex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}
std::string bytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> text(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

TEST(Crypto, Aes256GcmMatchesTheSpecificationsTestCase16) {
  // McGrew and Viega, "The Galois/Counter Mode of Operation", test case 16 (also checked with
  // Python's cryptography package when this test was written).
  const std::string key = bytes(hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"));
  const std::string iv = bytes(hex("cafebabefacedbaddecaf888"));
  const auto aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  const auto plain = hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e24"
                         "49a6b525b16aedf5aa0de657ba637b39");
  const auto want = hex("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056"
                        "828838c5f61e6393ba7a0abcc9f662" "76fc6ece0f4e1768cddf8853bb2d551b");
  std::vector<uint8_t> sealed(plain.size() + crypto::kGcmTagBytes);
  crypto::aes256gcm_seal(key, iv, aad, plain, sealed);
  EXPECT_EQ(sealed, want);
  std::vector<uint8_t> opened(plain.size());
  ASSERT_TRUE(crypto::aes256gcm_open(key, iv, aad, sealed, opened));
  EXPECT_EQ(opened, plain);
  // Any altered byte, of the ciphertext, the tag or the aad, and the tag does not verify.
  for (size_t at : {size_t{0}, plain.size() - 1, plain.size(), sealed.size() - 1}) {
    auto bad = sealed;
    bad[at] ^= 1;
    EXPECT_FALSE(crypto::aes256gcm_open(key, iv, aad, bad, opened)) << "byte " << at;
    EXPECT_EQ(opened, std::vector<uint8_t>(plain.size(), 0)) << "a failed open leaves nothing readable";
  }
  auto bad_aad = aad;
  bad_aad[3] ^= 0x80;
  EXPECT_FALSE(crypto::aes256gcm_open(key, iv, bad_aad, sealed, opened));
  EXPECT_THROW(crypto::aes256gcm_seal(key.substr(1), iv, aad, plain, sealed), Error);
}

struct Pair {
  SealedChannel a, b;  // a initiates
  Pair(const std::string& secret = std::string(32, 's'), const std::string& salt = "salt-1",
       const std::string& channel = "pair 0.0-1.0 round 3 attempt 0")
      : a(secret, salt, "job", channel, true), b(secret, salt, "job", channel, false) {}
};

TEST(SealedChannel, MessagesOpenInOrderBothWaysWithTheirHeaders) {
  Pair p;
  const auto h = text("tag 7, 5 bytes");
  for (int k = 0; k < 3; ++k) {
    const auto m = text("hello " + std::to_string(k));
    EXPECT_EQ(p.b.open(p.a.seal(m, h), h), m);
    EXPECT_EQ(p.a.open(p.b.seal(m, h), h), m);
  }
  EXPECT_EQ(p.a.sent(), 3u);
  EXPECT_EQ(p.b.received(), 3u);
  EXPECT_EQ(p.b.open(p.a.seal({})), std::vector<uint8_t>{});  // an empty message still proves its sender
}

TEST(SealedChannel, ReplayedReorderedReflectedOrAlteredMessagesDoNotOpenAndHonestOnesStillDo) {
  Pair p;
  const auto m0 = p.a.seal(text("round 3"));
  const auto m1 = p.a.seal(text("round 4"));
  EXPECT_THROW(p.b.open(m1), SealError);  // reordered: message 1 where 0 is due
  EXPECT_THROW(p.a.open(m0), SealError);  // reflected back to its sender
  auto flipped = m0;
  flipped[2] ^= 4;
  try {
    p.b.open(flipped);
    ADD_FAILURE() << "an altered message opened";
  } catch (const SealError& e) {
    EXPECT_NE(std::string(e.what()).find("pair 0.0-1.0 round 3 attempt 0"), std::string::npos) << e.what();
    EXPECT_EQ(e.failed_rank(), -1) << "a failed open must not blame the sender";
  }
  EXPECT_THROW(p.b.open(m0, text("another header")), SealError);
  EXPECT_THROW(p.b.open(std::vector<uint8_t>(5, 0)), SealError);  // shorter than a tag
  // None of the failures moved the count: the honest stream opens as sent.
  EXPECT_EQ(bytes(p.b.open(m0)), "round 3");
  EXPECT_THROW(p.b.open(m0), SealError);  // replayed
  EXPECT_EQ(bytes(p.b.open(m1)), "round 4");
}

TEST(SealedChannel, AnotherChannelRunSecretOrJobOpensNothing) {
  Pair p;
  const auto m = p.a.seal(text("parameters"));
  EXPECT_THROW(Pair(std::string(32, 's'), "salt-1", "pair 0.0-2.0 round 3 attempt 0").b.open(m), SealError);  // misdirected
  EXPECT_THROW(Pair(std::string(32, 's'), "salt-1", "pair 0.0-1.0 round 3 attempt 1").b.open(m), SealError);  // an old attempt
  EXPECT_THROW(Pair(std::string(32, 's'), "salt-2").b.open(m), SealError);  // a restarted store: a new salt
  EXPECT_THROW(Pair(std::string(32, 'x')).b.open(m), SealError);            // another secret
  SealedChannel other_job(std::string(32, 's'), "salt-1", "job2", "pair 0.0-1.0 round 3 attempt 0", false);
  EXPECT_THROW(other_job.open(m), SealError);
  EXPECT_EQ(bytes(p.b.open(m)), "parameters");
  EXPECT_THROW(SealedChannel("", "salt", "job", "c", true), Error);
}

}  // namespace

// A job secret (core/secret.hpp) and the rendezvous store's authentication with it
// (comm/store.hpp, store_auth): holders of the secret use the store as before; a client with
// another secret or none is refused at once and the store goes on serving; a client that skips
// the handshake, replays a recorded request or alters one gets its connection closed and
// nothing applied. The secret file: mode 0600, never overwritten, refused when others may read it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/comm/session_salt.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/secret.hpp"

using namespace gasloc;
using namespace gasloc::comm;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> b(const std::string& s) { return {s.begin(), s.end()}; }
std::string s(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

const std::string kSecret(32, '\x5a');
const std::string kOther(32, '\xa5');

JobIdentity job(const std::string& secret, const std::string& token = "tok") { return {token, "test", secret}; }

// A raw connection to a store on 127.0.0.1, reads bounded by 5 s.
int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

uint32_t u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// One frame's payload (after its length); "" when the server closed the connection instead.
std::string read_frame(int fd) {
  std::string in;
  auto until = [&](size_t n) {
    while (in.size() < n) {
      char buf[4096];
      const ssize_t got = ::recv(fd, buf, std::min(sizeof buf, n - in.size()), 0);
      if (got <= 0) return false;
      in.append(buf, static_cast<size_t>(got));
    }
    return true;
  };
  if (!until(4)) return "";
  if (!until(4 + u32(in.data()))) return "";
  return in.substr(4);
}

// A payload's code and fields (the wire format of store.hpp).
struct Frame {
  uint8_t code = 255;
  std::vector<std::string> fields;
};
Frame parse(const std::string& p) {
  Frame f;
  if (p.size() < 5) return f;
  f.code = static_cast<uint8_t>(p[0]);
  size_t at = 5;
  for (uint32_t k = 0, n = u32(p.data() + 1); k < n && at + 4 <= p.size(); ++k) {
    const uint32_t len = u32(p.data() + at);
    f.fields.push_back(p.substr(at + 4, len));
    at += 4 + len;
  }
  return f;
}

// True when the server hung up on fd (no reply comes; a reset counts), false for a reply or
// nothing within the receive timeout.
bool closed_by_server(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// A client that speaks store_auth by hand: its connection's key, for sealing requests.
struct HandClient {
  int fd = -1;
  std::string k_conn;
  ~HandClient() {
    if (fd >= 0) ::close(fd);
  }
};
void handshake(HandClient& h, int port, const std::string& secret, const std::string& token = "tok") {
  h.fd = raw_connect(port);
  send_all(h.fd, encode_frame(static_cast<uint8_t>(StoreOp::kAuthHello), {token, "by hand"}));
  const Frame challenge = parse(read_frame(h.fd));
  ASSERT_EQ(challenge.code, static_cast<uint8_t>(StoreStatus::kOk));
  ASSERT_EQ(challenge.fields.size(), 1u);
  const std::string n_s = challenge.fields[0], n_c(store_auth::kNonceBytes, 'c'), id = "hand";
  const std::string k_store = store_auth::store_key(secret, token);
  send_all(h.fd, encode_frame(static_cast<uint8_t>(StoreOp::kAuthProof),
                              {id, n_c, store_auth::client_proof(k_store, n_s, n_c, id, token)}));
  const Frame proof = parse(read_frame(h.fd));
  ASSERT_EQ(proof.code, static_cast<uint8_t>(StoreStatus::kOk));
  ASSERT_EQ(proof.fields.size(), 1u);
  EXPECT_EQ(proof.fields[0], store_auth::server_proof(k_store, n_s, n_c, id, token));
  h.k_conn = store_auth::connection_key(k_store, n_s, n_c, id);
}

// The reply to a sealed request number `seq`, opened; fails the test when it does not verify.
Frame sealed_reply(const HandClient& h, uint64_t seq) {
  const std::string p = read_frame(h.fd);
  std::string payload, why;
  EXPECT_TRUE(store_auth::open_payload(h.k_conn, 'r', seq, p, payload, why)) << why;
  return parse(payload);
}

std::string text_of(const Error& e) { return std::string(e.what()) + " / " + e.hint(); }

}  // namespace

TEST(StoreAuth, HoldersOfTheSecretUseTheStoreAsBefore) {
  StoreServer server({"127.0.0.1", 0, false, job(kSecret)});
  StoreClient client("127.0.0.1", server.port(), 5s, job(kSecret));
  auto host = server.local();
  client.set("a", b("hello"));
  EXPECT_EQ(s(host->get("a")), "hello");
  host->set("big", std::vector<uint8_t>(3 << 20, 7));
  EXPECT_EQ(client.get("big").size(), size_t{3 << 20});
  EXPECT_EQ(client.add("n", 5), 5);
  EXPECT_EQ(client.add("n", -2), 3);
  EXPECT_EQ(s(client.compareSet("c", {}, b("x"))), "x");
  EXPECT_EQ(s(client.compareSet("c", b("x"), b("y"))), "y");
  EXPECT_TRUE(client.check({"a", "n"}));
  EXPECT_FALSE(client.check({"missing"}));
  EXPECT_TRUE(client.deleteKey("a"));
  EXPECT_EQ(client.getNumKeys(), 3);
  client.wait({"n"}, 1s);
  // A second client of the same job, on its own connection key.
  StoreClient second("127.0.0.1", server.port(), 5s, job(kSecret));
  EXPECT_EQ(second.add("n", 1), 4);
}

// Every start of a store with a secret draws its own salt (the data plane's keys are new at every
// start), which every holder reads alike, and no client writes, deletes or counts among the keys.
TEST(StoreAuth, EveryStartDrawsItsOwnReadOnlySessionSalt) {
  StoreServer first({"127.0.0.1", 0, false, job(kSecret)});
  StoreClient a("127.0.0.1", first.port(), 5s, job(kSecret));
  StoreClient b2("127.0.0.1", first.port(), 5s, job(kSecret));
  const std::string salt = read_session_salt(a);
  EXPECT_EQ(salt.size(), kSessionSaltBytes);
  EXPECT_NE(salt, std::string(kSessionSaltBytes, '\0'));
  EXPECT_EQ(read_session_salt(b2), salt);
  EXPECT_EQ(read_session_salt(*first.local()), salt);
  EXPECT_TRUE(a.check({kSessionSaltKey}));
  EXPECT_EQ(a.getNumKeys(), 0) << "the salt is not one of the store's keys";
  // Read-only: every write is refused and leaves it as it was.
  EXPECT_ANY_THROW(first.local()->set(kSessionSaltKey, b("mine")));
  EXPECT_ANY_THROW(first.local()->compareSet(kSessionSaltKey, b(salt), b("mine")));
  EXPECT_ANY_THROW(first.local()->add(kSessionSaltKey, 1));
  EXPECT_ANY_THROW(first.local()->deleteKey(kSessionSaltKey));
  EXPECT_ANY_THROW(a.set(kSessionSaltKey, b("mine")));
  StoreClient c("127.0.0.1", first.port(), 5s, job(kSecret));
  EXPECT_EQ(read_session_salt(c), salt);
  // Another start, the same job and secret: another salt.
  StoreServer second({"127.0.0.1", 0, false, job(kSecret)});
  StoreClient d("127.0.0.1", second.port(), 5s, job(kSecret));
  EXPECT_NE(read_session_salt(d), salt);
  // Without a secret there is none, and reading it says why.
  StoreServer open({"127.0.0.1", 0, false, job("")});
  StoreClient e("127.0.0.1", open.port(), 5s, job(""));
  EXPECT_FALSE(e.check({kSessionSaltKey}));
  try {
    read_session_salt(e);
    FAIL() << "a store without a secret gave a salt";
  } catch (const CommError& err) {
    EXPECT_NE(text_of(err).find("without the job's secret"), std::string::npos) << text_of(err);
  }
}

TEST(StoreAuth, AWrongOrMissingSecretIsRefusedAtOnceAndOthersAreStillServed) {
  // No token given to the host: a refused client must not pin the job either.
  StoreServer server({"127.0.0.1", 0, false, job(kSecret, "")});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    StoreClient wrong("127.0.0.1", server.port(), 30s, job(kOther, "intruder"));
    FAIL() << "a client with another secret was served";
  } catch (const AuthError& e) {
    EXPECT_NE(text_of(e).find("cluster.secret_file"), std::string::npos) << text_of(e);
    EXPECT_NE(text_of(e).find("did not verify"), std::string::npos) << text_of(e);
  }
  try {
    StoreClient none("127.0.0.1", server.port(), 30s, job(""));
    FAIL() << "a client without a secret was served";
  } catch (const AuthError& e) {
    EXPECT_NE(text_of(e).find("cluster.secret_file"), std::string::npos) << text_of(e);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
      << "refusals must come at once, not at the timeout";
  EXPECT_EQ(server.job().token, "") << "a client that did not prove the secret pinned the job";
  EXPECT_EQ(server.local()->getNumKeys(), 0);
  StoreClient good("127.0.0.1", server.port(), 5s, job(kSecret));
  good.set("k", b("v"));
  EXPECT_EQ(s(server.local()->get("k")), "v");
  EXPECT_EQ(server.job().token, "tok");
  // A client with a secret at a store without one is refused too, naming the key.
  StoreServer open({"127.0.0.1", 0, false, job("")});
  try {
    StoreClient c("127.0.0.1", open.port(), 5s, job(kSecret));
    FAIL() << "a store without a secret served a client that has one";
  } catch (const AuthError& e) {
    EXPECT_NE(text_of(e).find("secret"), std::string::npos) << text_of(e);
  }
}

TEST(StoreAuth, ARankWithTheWrongSecretNeverRegisters) {
  StoreHost host("127.0.0.1", 0, 10, job(kSecret));
  GlooOptions o;
  o.rank = 0;
  o.world = 2;
  o.master_addr = "127.0.0.1";
  o.master_port = host.port();
  o.timeout_s = 10;
  o.connect_only = true;
  o.job = job(kOther);
  EXPECT_THROW(join_store(o), AuthError);
  EXPECT_FALSE(host.store().check({"rank/0"}));
  EXPECT_EQ(host.store().add("joined", 0), 0);
}

TEST(StoreAuth, AClientThatSkipsTheHandshakeIsHungUpOnAndNothingIsApplied) {
  StoreServer server({"127.0.0.1", 0, false, job(kSecret)});
  const int raw = raw_connect(server.port());
  send_all(raw, encode_frame(static_cast<uint8_t>(StoreOp::kSet), {"k", "v"}));
  EXPECT_TRUE(closed_by_server(raw));
  ::close(raw);
  // Today's greeting without a secret: refused with the reason, then hung up on.
  const int plain = raw_connect(server.port());
  send_all(plain, encode_frame(static_cast<uint8_t>(StoreOp::kHello), {"tok", "plain"}));
  const Frame refusal = parse(read_frame(plain));
  EXPECT_EQ(refusal.code, static_cast<uint8_t>(StoreStatus::kError));
  ASSERT_EQ(refusal.fields.size(), 2u);
  EXPECT_EQ(refusal.fields[1], "auth");
  EXPECT_TRUE(closed_by_server(plain));
  ::close(plain);
  // A challenge answered with a request instead of the proof.
  const int half = raw_connect(server.port());
  send_all(half, encode_frame(static_cast<uint8_t>(StoreOp::kAuthHello), {"tok", "half"}));
  EXPECT_EQ(parse(read_frame(half)).code, static_cast<uint8_t>(StoreStatus::kOk));
  send_all(half, encode_frame(static_cast<uint8_t>(StoreOp::kSet), {"k", "v"}));
  EXPECT_TRUE(closed_by_server(half));
  ::close(half);
  // A frame announced larger than any handshake: hung up on before it is buffered.
  const int big = raw_connect(server.port());
  send_all(big, std::string("\x00\x00\x10\x00", 4) + std::string(1000, 'x'));  // 1 MiB announced
  EXPECT_TRUE(closed_by_server(big));
  ::close(big);
  EXPECT_FALSE(server.local()->check({"k"}));
  StoreClient good("127.0.0.1", server.port(), 5s, job(kSecret));
  EXPECT_FALSE(good.check({"k"}));
}

TEST(StoreAuth, AReplayedRequestIsRejectedOnItsConnectionAndOnAnother) {
  StoreServer server({"127.0.0.1", 0, false, job(kSecret)});
  HandClient h;
  handshake(h, server.port(), kSecret);
  const std::string add = store_auth::seal_frame(h.k_conn, 'q', 0, static_cast<uint8_t>(StoreOp::kAdd), {"n", "1"});
  send_all(h.fd, add);
  const Frame r = sealed_reply(h, 0);
  EXPECT_EQ(r.code, static_cast<uint8_t>(StoreStatus::kOk));
  EXPECT_EQ(r.fields, std::vector<std::string>{"1"});
  send_all(h.fd, add);  // the same bytes again
  EXPECT_TRUE(closed_by_server(h.fd));
  EXPECT_EQ(server.local()->add("n", 0), 1);
  // The recorded bytes on a new connection (a new key): rejected too.
  HandClient other;
  handshake(other, server.port(), kSecret);
  send_all(other.fd, add);
  EXPECT_TRUE(closed_by_server(other.fd));
  EXPECT_EQ(server.local()->add("n", 0), 1);
  // Reordered: request 1 before request 0.
  HandClient third;
  handshake(third, server.port(), kSecret);
  send_all(third.fd, store_auth::seal_frame(third.k_conn, 'q', 1, static_cast<uint8_t>(StoreOp::kAdd), {"n", "1"}));
  EXPECT_TRUE(closed_by_server(third.fd));
  EXPECT_EQ(server.local()->add("n", 0), 1);
  // A reply sent back as a request (direction differs): rejected.
  HandClient fourth;
  handshake(fourth, server.port(), kSecret);
  send_all(fourth.fd, store_auth::seal_frame(fourth.k_conn, 'r', 0, static_cast<uint8_t>(StoreOp::kAdd), {"n", "1"}));
  EXPECT_TRUE(closed_by_server(fourth.fd));
  EXPECT_EQ(server.local()->add("n", 0), 1);
}

TEST(StoreAuth, AFlippedByteInASealedRequestIsRejected) {
  StoreServer server({"127.0.0.1", 0, false, job(kSecret)});
  for (size_t at : {size_t{4}, size_t{12}, size_t{20}}) {  // the code, a field's bytes, the value
    HandClient h;
    handshake(h, server.port(), kSecret);
    std::string frame = store_auth::seal_frame(h.k_conn, 'q', 0, static_cast<uint8_t>(StoreOp::kSet), {"key", "value"});
    ASSERT_LT(at, frame.size());
    frame[at] = static_cast<char>(frame[at] ^ 0x01);
    send_all(h.fd, frame);
    EXPECT_TRUE(closed_by_server(h.fd)) << "byte " << at;
  }
  {  // the MAC itself
    HandClient h;
    handshake(h, server.port(), kSecret);
    std::string frame = store_auth::seal_frame(h.k_conn, 'q', 0, static_cast<uint8_t>(StoreOp::kSet), {"key", "value"});
    frame.back() = static_cast<char>(frame.back() ^ 0x80);
    send_all(h.fd, frame);
    EXPECT_TRUE(closed_by_server(h.fd));
  }
  EXPECT_FALSE(server.local()->check({"key"}));
  EXPECT_EQ(server.local()->getNumKeys(), 0);
  // The same request unaltered is served.
  HandClient h;
  handshake(h, server.port(), kSecret);
  send_all(h.fd, store_auth::seal_frame(h.k_conn, 'q', 0, static_cast<uint8_t>(StoreOp::kSet), {"key", "value"}));
  EXPECT_EQ(sealed_reply(h, 0).code, static_cast<uint8_t>(StoreStatus::kOk));
  EXPECT_EQ(s(server.local()->get("key")), "value");
}

// A connection that has not proved the secret within the handshake's deadline is closed, whether
// it said nothing or stopped after the challenge; the job's own clients are served on.
TEST(StoreAuth, AStalledHandshakeIsClosedAtItsDeadline) {
  StoreServerOptions o{"127.0.0.1", 0, false, job(kSecret)};
  o.handshake_timeout = 200ms;
  StoreServer server(o);
  const int silent = raw_connect(server.port());
  const int halfway = raw_connect(server.port());
  send_all(halfway, encode_frame(static_cast<uint8_t>(StoreOp::kAuthHello), {"tok", "stalls"}));
  EXPECT_EQ(parse(read_frame(halfway)).code, static_cast<uint8_t>(StoreStatus::kOk));
  EXPECT_TRUE(closed_by_server(silent)) << "an idle connection outlived the handshake's deadline";
  EXPECT_TRUE(closed_by_server(halfway)) << "a stalled handshake outlived its deadline";
  ::close(silent);
  ::close(halfway);
  StoreClient good("127.0.0.1", server.port(), 5s, job(kSecret));
  good.set("k", b("v"));
  EXPECT_EQ(s(good.get("k")), "v");
}

// Past the cap on unproven connections the oldest is closed to admit the newest, so that a flood
// of idle or half-sent connections never keeps the job's own ranks out.
TEST(StoreAuth, AFloodOfUnprovenConnectionsClosesTheOldestAndTheJobIsServed) {
  StoreServerOptions o{"127.0.0.1", 0, false, job(kSecret)};
  o.max_unproven = 16;
  StoreServer server(o);
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    flood.push_back(raw_connect(server.port()));
    if (i % 2 == 1) send_all(flood.back(), std::string("\xe8\x03\x00\x00", 4) + std::string(500, 'x'));  // half of 1000 bytes
  }
  StoreClient good("127.0.0.1", server.port(), 5s, job(kSecret));
  good.set("k", b("v"));
  EXPECT_EQ(s(good.get("k")), "v");
  EXPECT_TRUE(closed_by_server(flood.front())) << "the oldest unproven connection was kept past the cap";
  EXPECT_TRUE(closed_by_server(flood[1])) << "the oldest half-sent frame was kept past the cap";
  for (int fd : flood) ::close(fd);
}

// Before the proof only the handshake's short frames are read: a frame announced longer is
// hung up on at its header, before any of it is buffered.
TEST(StoreAuth, AFrameLongerThanAHandshakeIsRefusedBeforeTheProof) {
  StoreServer server({"127.0.0.1", 0, false, job(kSecret)});
  const int fresh = raw_connect(server.port());
  send_all(fresh, std::string("\x00\x08\x00\x00", 4) + std::string(1000, 'x'));  // 2 KiB announced
  EXPECT_TRUE(closed_by_server(fresh));
  ::close(fresh);
  const int challenged = raw_connect(server.port());
  send_all(challenged, encode_frame(static_cast<uint8_t>(StoreOp::kAuthHello), {"tok", "then a long frame"}));
  EXPECT_EQ(parse(read_frame(challenged)).code, static_cast<uint8_t>(StoreStatus::kOk));
  send_all(challenged, std::string("\x01\x04\x00\x00", 4) + std::string(1000, 'x'));  // kMaxHandshakeBytes + 1
  EXPECT_TRUE(closed_by_server(challenged));
  ::close(challenged);
  // A holder of the secret with a long label (a deep run directory) and a long host name is
  // served: the client cuts both to what a handshake frame holds.
  JobIdentity deep = job(kSecret);
  deep.label = "gasloc train run_dir=" + std::string(5000, 'd');
  StoreClient good("127.0.0.1", server.port(), 5s, deep);
  good.set("k", b("v"));
  EXPECT_EQ(s(server.local()->get("k")), "v");
}

namespace {
// Everything the server sends on fd until it hangs up (or 5 s of silence).
std::string all_said(int fd) {
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) said.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return said;
}
}  // namespace

// A store with a secret tells a connection that has not proved it nothing about its job: not its
// token, not its label (the launcher's pid, the run directory), not whether a guessed token is
// right. A holder of the secret from another job is told both jobs, after its proof.
TEST(StoreAuth, NothingAboutTheJobIsToldBeforeTheProof) {
  const JobIdentity ours{"0123456789abcdef", "gasloc launch pid 4242 run_dir=/runs/private", kSecret};
  StoreServer server({"127.0.0.1", 0, false, ours});
  auto says_nothing_of_the_job = [&](const std::string& said, const char* what) {
    EXPECT_FALSE(said.empty()) << what << ": no answer";
    for (const std::string secret_bit : {ours.token, std::string("4242"), std::string("/runs/private"), ours.label})
      EXPECT_EQ(said.find(secret_bit), std::string::npos) << what << " told '" << secret_bit << "': " << said;
  };
  {  // another job's token, then a proof under another secret
    const int fd = raw_connect(server.port());
    send_all(fd, encode_frame(static_cast<uint8_t>(StoreOp::kAuthHello), {"intruder", "x"}));
    const std::string challenge = read_frame(fd);
    says_nothing_of_the_job(challenge, "the challenge to another token");
    const Frame c = parse(challenge);
    ASSERT_EQ(c.fields.size(), 1u) << "another token was refused before its proof (the token was guessed wrong)";
    const std::string n_c(store_auth::kNonceBytes, 'c'), k = store_auth::store_key(kOther, "intruder");
    send_all(fd, encode_frame(static_cast<uint8_t>(StoreOp::kAuthProof),
                              {"x", n_c, store_auth::client_proof(k, c.fields[0], n_c, "x", "intruder")}));
    says_nothing_of_the_job(all_said(fd), "the refusal of a wrong proof");
  }
  {  // the greeting of a client without a secret
    const int fd = raw_connect(server.port());
    send_all(fd, encode_frame(static_cast<uint8_t>(StoreOp::kHello), {"intruder", "x"}));
    says_nothing_of_the_job(all_said(fd), "the refusal of a greeting without a secret");
  }
  try {
    StoreClient other("127.0.0.1", server.port(), 5s, JobIdentity{"fedcba9876543210", "another job", kSecret});
    FAIL() << "a client of another job was served";
  } catch (const ConfigError& e) {
    EXPECT_NE(text_of(e).find("/runs/private"), std::string::npos) << text_of(e);
    EXPECT_NE(text_of(e).find("another job"), std::string::npos) << text_of(e);
  }
}

namespace {
// A fake store for one StoreClient: a listener on 127.0.0.1 whose first connection the test
// serves by hand (to alter what the client receives).
struct FakeStore {
  int fd = -1, port = 0;
  FakeStore() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    timeval tv{10, 0};  // accept() gives up rather than hang a failing test
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~FakeStore() { ::close(fd); }
  // Accepts the client and does the server's half of the handshake; its proof is made with
  // `proof_secret` (the job's, or another). Returns the connection and sets k_conn.
  int serve_handshake(const std::string& secret, const std::string& proof_secret, std::string& k_conn) {
    const int c = ::accept(fd, nullptr, nullptr);
    timeval tv{5, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const Frame hello = parse(read_frame(c));
    EXPECT_EQ(hello.code, static_cast<uint8_t>(StoreOp::kAuthHello));
    const std::string token = hello.fields.at(0), n_s(store_auth::kNonceBytes, 's');
    send_all(c, encode_frame(static_cast<uint8_t>(StoreStatus::kOk), {n_s}));
    const Frame proof = parse(read_frame(c));
    EXPECT_EQ(proof.code, static_cast<uint8_t>(StoreOp::kAuthProof));
    const std::string id = proof.fields.at(0), n_c = proof.fields.at(1);
    const std::string k_store = store_auth::store_key(secret, token);
    EXPECT_EQ(proof.fields.at(2), store_auth::client_proof(k_store, n_s, n_c, id, token));
    send_all(c, encode_frame(static_cast<uint8_t>(StoreStatus::kOk),
                             {store_auth::server_proof(store_auth::store_key(proof_secret, token), n_s, n_c, id, token)}));
    k_conn = store_auth::connection_key(k_store, n_s, n_c, id);
    return c;
  }
};
}  // namespace

TEST(StoreAuth, AStoreThatCannotProveTheSecretIsRefusedByTheClient) {
  FakeStore fake;
  std::thread server([&] {
    std::string k;
    const int c = fake.serve_handshake(kSecret, kOther, k);
    ::close(c);
  });
  try {
    StoreClient client("127.0.0.1", fake.port, 5s, job(kSecret));
    ADD_FAILURE() << "the client trusted a store that did not prove the secret";  // not FAIL(): the thread is joined below
  } catch (const AuthError& e) {
    EXPECT_NE(text_of(e).find("did not prove"), std::string::npos) << text_of(e);
    EXPECT_NE(text_of(e).find("secret"), std::string::npos) << text_of(e);
  }
  server.join();
}

// A flooded store closes the oldest unproven connections, a rank's among them perhaps: a greeting
// that the store cut is tried again on a new connection within the client's timeout.
TEST(StoreAuth, AGreetingTheStoreCutIsTriedAgain) {
  FakeStore fake;
  std::thread server([&] {
    try {  // without a second connection (the failure tested for) accept() gives up after 10 s
      const int first = ::accept(fake.fd, nullptr, nullptr);
      read_frame(first);  // the greeting, unanswered
      ::close(first);
      std::string k;
      const int second = fake.serve_handshake(kSecret, kSecret, k);
      read_frame(second);  // request 0
      send_all(second, store_auth::seal_frame(k, 'r', 0, static_cast<uint8_t>(StoreStatus::kOk), {"1"}));
      char buf;
      ::recv(second, &buf, 1, 0);  // until the client hangs up
      ::close(second);
    } catch (const std::exception&) {
    }
  });
  try {
    StoreClient client("127.0.0.1", fake.port, 5s, job(kSecret));
    EXPECT_TRUE(client.check({"k"}));
  } catch (const CommError& e) {
    ADD_FAILURE() << "a greeting the store cut was not tried again: " << e.what();  // the thread is joined below
  }
  server.join();
}

TEST(StoreAuth, AnAlteredOrReplayedReplyFailsTheClientsCall) {
  for (const bool replay : {false, true}) {
    FakeStore fake;
    std::thread server([&] {
      std::string k;
      const int c = fake.serve_handshake(kSecret, kSecret, k);
      // Request 0 (check) answered honestly; request 1 (add) answered with a byte flipped, or
      // with the reply to request 0 again.
      read_frame(c);
      const std::string first = store_auth::seal_frame(k, 'r', 0, static_cast<uint8_t>(StoreStatus::kOk), {"1"});
      send_all(c, first);
      read_frame(c);
      std::string second = store_auth::seal_frame(k, 'r', 1, static_cast<uint8_t>(StoreStatus::kOk), {"5"});
      second[13] = static_cast<char>(second[13] ^ 0x04);  // the answer's digit (after length, code, count, field length): "5" -> "1"
      send_all(c, replay ? first : second);
      char buf;
      ::recv(c, &buf, 1, 0);  // until the client hangs up
      ::close(c);
    });
    StoreClient client("127.0.0.1", fake.port, 5s, job(kSecret));
    EXPECT_TRUE(client.check({"k"}));
    try {
      client.add("n", 5);
      ADD_FAILURE() << "the client took an " << (replay ? "replayed" : "altered") << " reply";  // the thread is joined below
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("failed its check"), std::string::npos) << e.what();
    }
    EXPECT_THROW(client.check({"k"}), CommError);  // the connection is closed
    server.join();
  }
}

TEST(SecretFile, WrittenWithMode0600NeverOverwrittenAndRefusedWhenOthersMayReadIt) {
  const fs::path dir = fs::temp_directory_path() / ("gasloc_secret_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "job.secret").string();
  write_secret_file(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string text;
  std::getline(std::ifstream(path), text);
  EXPECT_EQ(text.size(), 64u);
  const std::string secret = read_secret_file(path);
  EXPECT_EQ(secret.size(), kSecretBytes);
  EXPECT_EQ(crypto::to_hex(secret), text);
  // Never over an existing one.
  try {
    write_secret_file(path);
    FAIL() << "an existing secret was overwritten";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_secret_file(path), secret);
  // Two secrets differ.
  write_secret_file((dir / "second").string());
  EXPECT_NE(read_secret_file((dir / "second").string()), secret);
  // Readable by others: refused with the fix.
  ::chmod(path.c_str(), 0644);
  try {
    read_secret_file(path);
    FAIL() << "a secret others may read was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.hint().find("chmod 600 " + path), std::string::npos) << e.hint();
    EXPECT_NE(std::string(e.what()).find("cluster.secret_file"), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0640);
  EXPECT_THROW(read_secret_file(path), ConfigError);
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_secret_file(path), secret);
  // Too short, not hex, missing.
  auto write = [&](const std::string& name, const std::string& content) {
    const std::string p = (dir / name).string();
    std::ofstream(p) << content;
    ::chmod(p.c_str(), 0600);
    return p;
  };
  try {
    read_secret_file(write("short", "abcdef0123\n"));
    FAIL() << "a short secret was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_secret_file(write("nothex", std::string(64, 'z') + "\n")), ConfigError);
  EXPECT_THROW(read_secret_file((dir / "missing").string()), ConfigError);
  fs::remove_all(dir);
}

// Issue 62, item 6: a FIFO given as the secret hung gasloc store and launch in open(), waiting
// for a writer; it is refused at once, naming it (on the old code this test hangs).
TEST(SecretFile, AFifoIsRefusedAtOnceNamingIt) {
  const fs::path dir = fs::temp_directory_path() / ("gasloc_secret_fifo_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "job.secret").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  try {
    read_secret_file(path);
    FAIL() << "a FIFO was read as a secret";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Crypto, HmacAndHkdfMatchTheirReferenceVectors) {
  // RFC 4231 test case 2 (HMAC-SHA256) and RFC 5869 test case 1 (HKDF-SHA256).
  EXPECT_EQ(crypto::to_hex(crypto::hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string ikm(22, '\x0b');
  std::string salt, info;
  for (int i = 0; i <= 0x0c; ++i) salt.push_back(static_cast<char>(i));
  for (int i = 0xf0; i <= 0xf9; ++i) info.push_back(static_cast<char>(i));
  EXPECT_EQ(crypto::to_hex(crypto::hkdf_sha256(ikm, salt, info, 42)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  EXPECT_TRUE(crypto::equal("abc", "abc"));
  EXPECT_FALSE(crypto::equal("abc", "abd"));
  EXPECT_FALSE(crypto::equal("abc", "abcd"));
  EXPECT_NE(crypto::random_bytes(16), crypto::random_bytes(16));
}

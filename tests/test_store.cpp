// gasloc's rendezvous store (src/gasloc/comm/store.hpp): c10d's Store semantics over its wire
// format, every client call bounded by its timeout and by a stop request, one job per store, a
// server that survives garbage, and the arrival records that name ranks that never came.
#include <algorithm>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <thread>

#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"

using namespace gasloc;
using namespace gasloc::comm;
using namespace std::chrono_literals;

namespace {

std::vector<uint8_t> b(const std::string& s) { return {s.begin(), s.end()}; }
std::string s(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A TCP listener on 127.0.0.1 that never accepts or answers (a SIGSTOPped store host, or another
// program on the port): the kernel completes connections into its backlog.
struct SilentListener {
  int fd = -1, port = 0;
  SilentListener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~SilentListener() { ::close(fd); }
};

// Connects fd to a store on loopback; its reads bounded by 5 s.
void connect_loopback(int fd, int port) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
}

// A raw connection to a store, for speaking its wire format by hand; reads bounded by 5 s.
int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  connect_loopback(fd, port);
  return fd;
}

// True when the server hung up on fd (a reset counts), false for bytes or 5 s of silence.
bool closed_by_server(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

void send_all(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// This process's open-file limit lowered to `headroom` descriptors above those open now, for one
// test, and set back after it.
struct FewFileDescriptors {
  rlimit before{};
  explicit FewFileDescriptors(int headroom) {
    ::getrlimit(RLIMIT_NOFILE, &before);
    std::vector<int> open;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
      open.push_back(std::stoi(e.path().filename().string()));
    std::sort(open.begin(), open.end());
    // New descriptors take the lowest free numbers below the limit: `headroom` of them free.
    rlim_t limit = static_cast<rlim_t>(headroom);
    for (int fd : open)
      if (static_cast<rlim_t>(fd) < limit) ++limit;
    rlimit few = before;
    few.rlim_cur = limit;
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &few), 0);
  }
  ~FewFileDescriptors() { ::setrlimit(RLIMIT_NOFILE, &before); }
};

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

}  // namespace

TEST(Store, ClientAndHostSeeTheSameKeys) {
  StoreServer server({"127.0.0.1", 0, false, {"tok", "test"}});
  StoreClient client("127.0.0.1", server.port(), 5s, {"tok", "test"});
  auto host = server.local();
  client.set("a", b("hello"));
  EXPECT_EQ(s(host->get("a")), "hello");
  host->set("big", std::vector<uint8_t>(3 << 20, 7));  // larger than one socket read
  EXPECT_EQ(client.get("big").size(), size_t{3 << 20});
  EXPECT_EQ(client.add("n", 5), 5);
  EXPECT_EQ(host->add("n", -2), 3);
  EXPECT_EQ(client.add("n", 0), 3);
  EXPECT_TRUE(client.check({"a", "n"}));
  EXPECT_FALSE(client.check({"a", "missing"}));
  EXPECT_EQ(client.getNumKeys(), 3);
  EXPECT_TRUE(client.deleteKey("a"));
  EXPECT_FALSE(client.deleteKey("a"));
  EXPECT_FALSE(host->check({"a"}));
}

TEST(Store, CompareSetFollowsC10dSemantics) {
  StoreServer server({"127.0.0.1", 0, false, {}});
  StoreClient c("127.0.0.1", server.port(), 5s, {});
  EXPECT_EQ(s(c.compareSet("k", {}, b("first"))), "first");    // missing, expected empty: set
  EXPECT_EQ(s(c.compareSet("k", {}, b("second"))), "first");   // present, expected differs: kept
  EXPECT_EQ(s(c.compareSet("k", b("first"), b("third"))), "third");
  EXPECT_EQ(s(c.compareSet("other", b("x"), b("y"))), "x");   // missing, expected not empty: not set
  EXPECT_FALSE(c.check({"other"}));
}

TEST(Store, AddRefusesAKeyThatHoldsText) {
  StoreServer server({"127.0.0.1", 0, false, {}});
  StoreClient c("127.0.0.1", server.port(), 5s, {});
  c.set("k", b("text"));
  EXPECT_THROW(c.add("k", 1), CommError);
  EXPECT_EQ(c.add("n", 1), 1);  // the connection is still good
}

TEST(Store, GetAndWaitEndAtTheirTimeout) {
  StoreServer server({"127.0.0.1", 0, false, {}});
  StoreClient c("127.0.0.1", server.port(), 300ms, {});
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c.get("never"), CommError);
  EXPECT_GE(seconds_since(t0), 0.29);
  EXPECT_LT(seconds_since(t0), 5.0);
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    server.local()->set("soon", b("1"));
  });
  c.wait({"soon"}, 5000ms);  // returns once another client sets it
  later.join();
}

TEST(Store, ASilentListenerIsAnErrorWithinTheTimeoutNotAHang) {
  SilentListener silent;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    StoreClient c("127.0.0.1", silent.port, 1000ms, {"tok", "test"});
    FAIL() << "connected to a store that never answers";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("SIGSTOP"), std::string::npos) << e.hint();
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Store, AStopRequestEndsAWaitOnASilentStore) {
  SilentListener silent;
  clear_interrupt();
  std::thread ctrl_c([] {
    std::this_thread::sleep_for(300ms);
    request_interrupt();
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    StoreClient c("127.0.0.1", silent.port, 60000ms, {});
    FAIL() << "connected to a store that never answers";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted"), std::string::npos) << e.what();
  }
  ctrl_c.join();
  clear_interrupt();
  EXPECT_LT(seconds_since(t0), 10.0);  // not the 60 s timeout
}

TEST(Store, AnotherJobIsRefusedNamingBoth) {
  StoreServer server({"127.0.0.1", 0, false, {"aaaa", "train run_dir=runs/a"}});
  try {
    StoreClient c("127.0.0.1", server.port(), 5s, {"bbbb", "train run_dir=runs/b"});
    FAIL() << "a second job joined the store";
  } catch (const ConfigError& e) {  // the rank's port or job is wrong: exit status 2, no restart
    const std::string m = e.what();
    EXPECT_NE(m.find("runs/a"), std::string::npos) << m;
    EXPECT_NE(m.find("runs/b"), std::string::npos) << m;
  }
  StoreClient same("127.0.0.1", server.port(), 5s, {"aaaa", "train run_dir=runs/a"});
  same.set("ok", b("1"));
}

TEST(Store, TheFirstTokenPinsTheJobWhenTheHostGaveNone) {
  StoreServer server({"127.0.0.1", 0, false, {}});
  StoreClient first("127.0.0.1", server.port(), 5s, {"t1", "first"});
  EXPECT_EQ(server.job().token, "t1");
  EXPECT_THROW(StoreClient("127.0.0.1", server.port(), 5s, {"t2", "second"}), ConfigError);
}

TEST(Store, GarbageClosesThatClientOnlyAndRequestsNeedAGreeting) {
  StoreServer server({"127.0.0.1", 0, false, {}});
  const int rogue = raw_connect(server.port());
  const char junk[] = "\xff\xff\xff\xffGET / HTTP/1.1\r\n\r\n";
  ASSERT_GT(::send(rogue, junk, sizeof junk - 1, MSG_NOSIGNAL), 0);
  char buf[16];
  EXPECT_EQ(::recv(rogue, buf, sizeof buf, 0), 0);  // the server hung up on it
  ::close(rogue);
  // A well-formed request before the greeting is refused, not served.
  const int early = raw_connect(server.port());
  const std::string frame = encode_frame(static_cast<uint8_t>(StoreOp::kSet), {"k", "v"});
  ASSERT_EQ(::send(early, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  char reply[256];
  const ssize_t n = ::recv(early, reply, sizeof reply, 0);
  ASSERT_GT(n, 4);
  EXPECT_EQ(reply[4], static_cast<char>(StoreStatus::kError));
  ::close(early);
  StoreClient good("127.0.0.1", server.port(), 5s, {});
  EXPECT_FALSE(good.check({"k"}));
  good.set("k", b("v"));
  EXPECT_TRUE(good.check({"k"}));
}

// Before its greeting a client may send only the greeting's short frame, and only within the
// handshake's deadline (kHandshakeTimeout; shortened here).
TEST(Store, BeforeItsGreetingAClientHasADeadlineAndOnlyShortFrames) {
  StoreServerOptions o{"127.0.0.1", 0, false, {"tok", "test"}};
  o.handshake_timeout = 200ms;
  StoreServer server(o);
  const int idle = raw_connect(server.port());
  EXPECT_TRUE(closed_by_server(idle)) << "an idle connection outlived the greeting's deadline";
  ::close(idle);
  const int big = raw_connect(server.port());
  std::string head_of_a_mib("\x00\x00\x10\x00", 4);  // 1 MiB announced, 1000 bytes of it sent
  send_all(big, head_of_a_mib.append(1000, 'x'));
  EXPECT_TRUE(closed_by_server(big)) << "a frame longer than a greeting was buffered before the greeting";
  ::close(big);
  // Once greeted, a client is not held to either (the deadline has passed meanwhile).
  StoreClient good("127.0.0.1", server.port(), 5s, {"tok", "test"});
  std::this_thread::sleep_for(300ms);
  good.set("big", std::vector<uint8_t>(1 << 20, 7));
  EXPECT_EQ(server.local()->get("big").size(), size_t{1 << 20});
}

// A job token must fit the greeting: a longer one is a configuration error at either end; a long
// label (a deep run directory) is cut.
TEST(Store, AJobTokenLongerThanAGreetingHoldsIsAConfigError) {
  const std::string long_token(kMaxIdentityBytes + 1, 't');
  EXPECT_THROW(StoreServer({"127.0.0.1", 0, false, {long_token, "test"}}), ConfigError);
  StoreServer server({"127.0.0.1", 0, false, {}});
  EXPECT_THROW(StoreClient("127.0.0.1", server.port(), 5s, {long_token, "test"}), ConfigError);
  StoreClient deep("127.0.0.1", server.port(), 5s, {"tok", "gasloc train run_dir=" + std::string(5000, 'd')});
  deep.set("k", b("v"));
  EXPECT_EQ(server.job().label.size(), kMaxIdentityBytes);
}

// Out of file descriptors (a flood of idle connections), the store closes the oldest unproven
// connection to accept a new one, rather than leaving them all queued and poll() waking at once
// for them again and again (a busy loop); a rank that comes afterwards is served.
TEST(Store, OutOfFileDescriptorsTheStoreShedsTheOldestUnprovenAndDoesNotSpin) {
  StoreServerOptions o{"127.0.0.1", 0, false, {"tok", "test"}};
  o.handshake_timeout = 60s;  // only running out of descriptors closes a connection here
  StoreServer server(o);
  std::vector<int> flood;
  {
    FewFileDescriptors few(120);  // 100 for the flood's ends, about 20 for the store's
    // Every end of the flood is made before any connects, so that the store's accepts, not the
    // flood's own sockets, are what runs out of descriptors.
    for (int i = 0; i < 100; ++i) flood.push_back(::socket(AF_INET, SOCK_STREAM, 0));
    for (int fd : flood) connect_loopback(fd, server.port());
    // CPU time, not wall time: an idle store uses about a millisecond of it in this second; one
    // that spins uses whatever share of a core it gets (0.4 s on a loaded 2-core machine).
    const double cpu0 = process_cpu_seconds();
    std::this_thread::sleep_for(1s);
    EXPECT_LT(process_cpu_seconds() - cpu0, 0.1) << "the store spun while out of file descriptors";
    EXPECT_TRUE(closed_by_server(flood.front())) << "the oldest unproven connection was not closed for a new one";
    for (int k = 0; k < 5; ++k) ::close(flood[k]);  // room for a rank's own end
    flood.erase(flood.begin(), flood.begin() + 5);
    StoreClient rank("127.0.0.1", server.port(), 5s, {"tok", "test"});
    rank.set("k", b("v"));
    EXPECT_EQ(s(rank.get("k")), "v");
  }
  for (int fd : flood) ::close(fd);
}

TEST(Store, ListensOnTheGivenAddressOnlyUnlessAsked) {
  StoreServer loopback({"127.0.0.1", 0, false, {}});
  EXPECT_EQ(loopback.address(), "127.0.0.1");
  StoreServer every({"127.0.0.1", 0, true, {}});
  EXPECT_TRUE(every.address() == "0.0.0.0" || every.address() == "::") << every.address();
  EXPECT_THROW(StoreServer({"127.0.0.1", loopback.port(), false, {}}), CommError);  // the port is taken
}

TEST(Store, DerivedTokensAgreeForOneTextAndDifferForAnother) {
  EXPECT_EQ(derive_job_token("run_dir=a"), derive_job_token("run_dir=a"));
  EXPECT_NE(derive_job_token("run_dir=a"), derive_job_token("run_dir=b"));
  EXPECT_EQ(derive_job_token("x").size(), 16u);
  EXPECT_NE(random_job_token(), random_job_token());
}

TEST(Arrivals, NameTheRanksThatNeverReachedACollective) {
  StoreServer server({"127.0.0.1", 0, false, {}});
  auto store = server.local();
  Arrivals r0(store, 0, 4), r1(store, 1, 4), r2(store, 2, 4), r3(store, 3, 4);
  for (auto* a : {&r0, &r1, &r2, &r3}) a->arrive("barrier");
  for (auto* a : {&r0, &r1, &r3}) a->arrive("all_reduce_mean");
  r0.arrive("broadcast");
  r1.arrive("broadcast");
  std::vector<int> late;
  const std::string who = r0.behind(3, &late);
  EXPECT_EQ(late, (std::vector<int>{2, 3}));
  EXPECT_NE(who.find("rank 2 (its last: #1 barrier)"), std::string::npos) << who;
  EXPECT_NE(who.find("rank 3 (its last: #2 all_reduce_mean)"), std::string::npos) << who;
  late.clear();
  EXPECT_EQ(r0.behind(1, &late), "");
  EXPECT_TRUE(late.empty());
}

TEST(Rendezvous, AHugeWorldWithMissingRanksGivesAShortError) {
  GlooOptions o;
  o.rank = 0;
  o.world = 100000;
  o.master_addr = "127.0.0.1";
  o.master_port = 0;
  o.timeout_s = 0.5;
  try {
    join_store(o);
    FAIL() << "rendezvous of 100000 ranks succeeded alone";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_LT(m.size(), 600u) << m.size();
    EXPECT_NE(m.find("ranks 1, 2, 3"), std::string::npos) << m;
    EXPECT_NE(m.find("and 99983 more"), std::string::npos) << m;
  }
}

// Issue 62, item 6: a second job at a `gasloc store` whose first job's ranks had all met there was
// refused as "two processes claim RANK=0"; it is told that the store serves one start of one job.
TEST(Rendezvous, ASecondStartAtAStoreThatServedOneSaysSo) {
  StoreServer server({"127.0.0.1", 0, false, {"tok", "test"}});
  GlooOptions o;
  o.rank = 0;
  o.world = 1;
  o.master_addr = "127.0.0.1";
  o.master_port = server.port();
  o.connect_only = true;  // as under gasloc store
  o.job = {"tok", "test"};
  o.timeout_s = 5;
  join_store(o);  // the first job's only rank met, and exits
  try {
    join_store(o);
    FAIL() << "a second start at the same store was let in";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("serves one start of one job"), std::string::npos) << m;
    EXPECT_NE(e.hint().find("start gasloc store again"), std::string::npos) << e.hint();
  }
}

// A rank's heartbeat thread counts up over its own connection and stops with its object; the
// host's watch judges a counter only once it has moved, and only after timeout_s of silence on
// the host's clock (here given by hand).
TEST(Heartbeat, BeatsUntilDestroyedAndTheWatchJudgesSilence) {
  StoreServer server({"127.0.0.1", 0, false, {"tok", "test"}});
  auto host = server.local();
  {
    Heartbeat beat(c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), std::chrono::milliseconds(2000),
                                                    JobIdentity{"tok", "test"}),
                   1, 0.02);
    for (int i = 0; i < 200 && host->add(heartbeat_key(1), 0) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GE(host->add(heartbeat_key(1), 0), 3);
  }
  const int64_t after = host->add(heartbeat_key(1), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(host->add(heartbeat_key(1), 0), after) << "the thread beat after its object was destroyed";

  HeartbeatWatch watch(3, 5.0);
  // The launcher looks five times a second (a longer gap is its own pause, which it forgives):
  // every look up to `t`, the last one's answer.
  double now = 0;
  auto look = [&](double t) {
    std::vector<int> s;
    do {
      now = std::min(t, now + 0.2);
      s = watch.stalled(*host, now);
    } while (now < t);
    return s;
  };
  EXPECT_TRUE(look(0.0).empty());  // rank 1 seen for the first time; 0 and 2 never beat
  EXPECT_TRUE(look(4.9).empty());
  EXPECT_EQ(look(5.0), std::vector<int>{1});
  host->add(heartbeat_key(1), 1);  // it beats again (seen at the next look, 5.2): judged afresh
  EXPECT_TRUE(look(9.0).empty());
  EXPECT_EQ(look(14.0), std::vector<int>{1});
  host->add(heartbeat_key(2), 1);
  EXPECT_EQ(look(18.9), std::vector<int>{1});  // rank 2 has just started beating
  // Rank 1 restarted: its new process is not judged until it beats, however long it starts.
  auto judged = [&](double t) {
    const auto s = look(t);
    return std::find(s.begin(), s.end(), 1) != s.end();
  };
  watch.forget(1);
  EXPECT_FALSE(judged(19.0));
  EXPECT_FALSE(judged(100.0));
  host->add(heartbeat_key(1), 1);  // seen at 100.2
  EXPECT_FALSE(judged(101.0));
  EXPECT_FALSE(judged(105.0));
  EXPECT_TRUE(judged(105.4));
}

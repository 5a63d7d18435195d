// The dashboard's data (study/dashboard.hpp): what the page polls, built from a run directory the
// test writes line by line, as a trainer does; and its HTTP server (apps/gasloc/http_server.hpp)
// on loopback, against clients that read slowly, connect and stay idle, or name another Host.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"
#include "gasloc/study/dashboard.hpp"
#include "gasloc/train/metrics.hpp"
#include "http_server.hpp"
#include "test_util.hpp"

namespace gasloc {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// A fresh run directory with a run.json of `workers` workers and `steps` steps, on data whose
// dataset.json records a unigram baseline of 3.25.
fs::path make_run(const std::string& name, int64_t workers, int64_t steps) {
  const fs::path dir = test_util::temp_root("dashboard") / name;
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  write_file_atomic(dir / "data" / "dataset.json", R"({"unigram_val_loss": 3.25})");
  const json info = {{"config",
                      {{"algo", {{"name", "gasloc"}, {"topology", "1peer"}}},
                       {"optim", {{"name", "adamw"}}},
                       {"train", {{"steps", steps}}},
                       {"model", {{"preset", "nano"}}},
                       {"cluster", {{"backend", "inproc"}, {"elastic", false}}}}},
                     {"world", workers},
                     {"dataset", {{"dir", (dir / "data").string()}}}};
  write_file_atomic(dir / "run.json", info.dump(2));
  return dir;
}

std::string line_of(const train::MetricsEvent& e) { return train::to_json(e).dump() + "\n"; }

void append(const fs::path& dir, const std::string& text) {
  std::ofstream f(dir / "metrics.jsonl", std::ios::app | std::ios::binary);
  f << text;
}

train::TrainEvent train_line(int64_t step, int64_t worker, double loss) {
  train::TrainEvent t;
  t.step = step;
  t.worker = worker;
  t.train_loss = loss;
  t.virtual_time_s = 0.5 * static_cast<double>(step) + 0.01 * static_cast<double>(worker);
  t.bytes_sent = 1'000'000 * step * (worker + 1);
  t.utilization = 0.5 + 0.1 * static_cast<double>(worker);
  return t;
}

train::EvalEvent eval_line(int64_t step, double val_loss, std::vector<double> own, std::vector<int64_t> members = {}) {
  train::EvalEvent e;
  e.step = step;
  e.val_loss = val_loss;
  e.worker_val_loss = std::move(own);
  e.members = std::move(members);
  e.consensus_distance = 0.001 * static_cast<double>(step);
  e.virtual_time_s = 0.5 * static_cast<double>(step);
  return e;
}

json watch_once(const fs::path& dir) {
  study::RunWatch watch(dir, "run");
  watch.refresh();
  return watch.to_json();
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

TEST(Dashboard, RunNotStartedOrWithoutMetricsYet) {
  const json missing = watch_once(test_util::temp_root("dashboard") / "never-created");
  EXPECT_EQ(missing["state"], "waiting");
  EXPECT_TRUE(missing["settings"].is_null());
  EXPECT_TRUE(missing["seconds_since_update"].is_null());

  const fs::path dir = make_run("no-metrics", 2, 20);
  const json started = watch_once(dir);
  EXPECT_EQ(started["state"], "no metrics yet");
  EXPECT_EQ(started["settings"]["label"], "gasloc-1peer");
  EXPECT_EQ(started["settings"]["workers"], 2);
  EXPECT_DOUBLE_EQ(started["unigram"].get<double>(), 3.25);
  EXPECT_TRUE(started["workers"].empty());
  EXPECT_TRUE(started["eval"]["step"].empty());
}

TEST(Dashboard, SeriesPerWorkerAndEvaluations) {
  const fs::path dir = make_run("two-workers", 2, 10);
  for (int64_t step : {5, 10})
    for (int64_t w : {0, 1}) append(dir, line_of(train_line(step, w, 5.0 - 0.1 * static_cast<double>(step + w))));
  append(dir, line_of(eval_line(10, 4.0, {4.1, 4.2})));
  const json j = watch_once(dir);

  ASSERT_EQ(j["workers"].size(), 2u);
  const json& w1 = j["workers"]["1"];
  EXPECT_EQ(doubles(w1["step"]), (std::vector<double>{5, 10}));
  EXPECT_EQ(doubles(w1["train_loss"]), (std::vector<double>{5.0 - 0.6, 5.0 - 1.1}));
  EXPECT_EQ(doubles(w1["mb_sent"]), (std::vector<double>{10, 20}));  // bytes / 1e6
  EXPECT_EQ(doubles(w1["time"]), (std::vector<double>{2.51, 5.01}));
  EXPECT_EQ(doubles(w1["utilization"]), (std::vector<double>{0.6, 0.6}));
  EXPECT_EQ(doubles(j["eval"]["val_loss"]), (std::vector<double>{4.0}));
  EXPECT_EQ(doubles(j["eval"]["consensus"]), (std::vector<double>{0.01}));
  EXPECT_EQ(doubles(j["eval"]["own"]["1"]["val_loss"]), (std::vector<double>{4.2}));
  EXPECT_EQ(j["last_step"], 10);
  EXPECT_EQ(j["state"], "finished");  // evaluated at train.steps
  EXPECT_TRUE(j["views"].empty());
}

// A dead worker (or one its local-step budget skipped) still logs lines, repeating its last
// loss: the chart shows a gap there, not a flat stretch of training.
TEST(Dashboard, StepsNotComputedAreGapsInTheTrainingLoss) {
  const fs::path dir = make_run("skipped", 1, 30);
  append(dir, line_of(train_line(10, 0, 4.0)));
  train::TrainEvent dead = train_line(20, 0, 4.0);
  dead.computed = false;
  append(dir, line_of(dead));
  append(dir, line_of(train_line(30, 0, 3.5)));
  const json j = json::parse(watch_once(dir).dump());  // as the page receives it
  const json& loss = j["workers"]["0"]["train_loss"];
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_EQ(loss[0], 4.0);
  EXPECT_TRUE(loss[1].is_null());
  EXPECT_EQ(loss[2], 3.5);
  EXPECT_EQ(doubles(j["workers"]["0"]["mb_sent"]), (std::vector<double>{10, 20, 30}));  // still counted
}

TEST(Dashboard, ViewChangesAndElasticMembers) {
  const fs::path dir = make_run("elastic", 3, 40);
  append(dir, line_of(train_line(10, 0, 4.0)));
  train::ViewEvent died;
  died.step = 12;
  died.round = 3;
  died.members = {0, 2};
  died.died = {1};
  died.virtual_time_s = 6.5;
  append(dir, line_of(died));
  // An elastic evaluation names its workers by the members' order: worker 1 has no model here.
  append(dir, line_of(eval_line(20, 3.9, {3.8, 3.7}, {0, 2})));
  train::ViewEvent joined = died;
  joined.step = 30;
  joined.members = {0, 1, 2};
  joined.died = {};
  joined.joined = {1};
  append(dir, line_of(joined));
  const json j = watch_once(dir);

  ASSERT_EQ(j["views"].size(), 2u);
  EXPECT_EQ(j["views"][0]["died"], json({1}));
  EXPECT_EQ(j["views"][0]["step"], 12);
  EXPECT_DOUBLE_EQ(j["views"][0]["time"].get<double>(), 6.5);
  EXPECT_EQ(j["views"][1]["joined"], json({1}));
  EXPECT_EQ(doubles(j["eval"]["own"]["2"]["val_loss"]), (std::vector<double>{3.7}));
  EXPECT_FALSE(j["eval"]["own"].contains("1"));
  EXPECT_EQ(j["state"], "training");
}

TEST(Dashboard, PartialLastLineWaitsForItsNewline) {
  const fs::path dir = make_run("partial", 1, 100);
  study::RunWatch watch(dir, "partial");
  watch.refresh();
  EXPECT_EQ(watch.to_json()["state"], "no metrics yet");

  const std::string second = line_of(train_line(10, 0, 3.5));
  append(dir, line_of(train_line(5, 0, 4.0)) + second.substr(0, second.size() / 2));
  watch.refresh();
  EXPECT_EQ(doubles(watch.to_json()["workers"]["0"]["step"]), (std::vector<double>{5}));
  // The whole object but not its newline: still being written.
  append(dir, second.substr(second.size() / 2, second.size() - second.size() / 2 - 1));
  watch.refresh();
  EXPECT_EQ(doubles(watch.to_json()["workers"]["0"]["step"]), (std::vector<double>{5}));
  append(dir, "\n");
  watch.refresh();
  const json j = watch.to_json();
  EXPECT_EQ(doubles(j["workers"]["0"]["step"]), (std::vector<double>{5, 10}));
  EXPECT_EQ(doubles(j["workers"]["0"]["train_loss"]), (std::vector<double>{4.0, 3.5}));
  EXPECT_EQ(j["state"], "training");
  watch.refresh();  // nothing new: nothing added twice
  EXPECT_EQ(watch.to_json()["workers"]["0"]["step"].size(), 2u);
}

TEST(Dashboard, RewrittenMetricsAreReadAgainFromTheStart) {
  const fs::path dir = make_run("resumed", 1, 100);
  study::RunWatch watch(dir, "resumed");
  append(dir, line_of(train_line(5, 0, 4.0)) + line_of(train_line(10, 0, 3.9)) + line_of(train_line(15, 0, 3.8)));
  watch.refresh();
  ASSERT_EQ(watch.to_json()["workers"]["0"]["step"].size(), 3u);
  // A resume from step 10 drops the lines after it (a new file), then trains on.
  write_file_atomic(dir / "metrics.jsonl", line_of(train_line(5, 0, 4.0)) + line_of(train_line(10, 0, 3.9)));
  append(dir, line_of(train_line(15, 0, 3.7)));
  watch.refresh();
  const json j = watch.to_json();
  EXPECT_EQ(doubles(j["workers"]["0"]["step"]), (std::vector<double>{5, 10, 15}));
  EXPECT_EQ(doubles(j["workers"]["0"]["train_loss"]), (std::vector<double>{4.0, 3.9, 3.7}));
}

TEST(Dashboard, NewerMetricsVersionIsTheRunsError) {
  const fs::path dir = make_run("newer", 1, 100);
  append(dir, line_of(train_line(5, 0, 4.0)) + R"({"event":"train","version":999,"step":10})" + "\n");
  const json j = watch_once(dir);
  ASSERT_TRUE(j.contains("error"));
  EXPECT_NE(j["error"].get<std::string>().find("version 999"), std::string::npos) << j["error"];
  EXPECT_EQ(doubles(j["workers"]["0"]["step"]), (std::vector<double>{5}));
}

// Issue 62, item 6: a FIFO in metrics.jsonl's place hung the dashboard's poll (and so the page);
// it is the run's error, naming it (on the old code this test hangs).
TEST(Dashboard, AFifoForMetricsIsTheRunsErrorNotAHang) {
  const fs::path dir = make_run("fifo", 1, 100);
  ASSERT_EQ(::mkfifo((dir / "metrics.jsonl").c_str(), 0600), 0);
  const json j = watch_once(dir);
  ASSERT_TRUE(j.contains("error"));
  EXPECT_NE(j["error"].get<std::string>().find("not a regular file"), std::string::npos) << j["error"];
}

TEST(Dashboard, EmbeddedJsonCannotCloseItsScript) {
  const json data = {{"name", "a</script><script>alert(1)</script>"}};
  const std::string text = study::json_for_html(data);
  EXPECT_EQ(text.find('<'), std::string::npos) << text;
  EXPECT_EQ(json::parse(text), data);  // the same document
}

TEST(Dashboard, FrozenPageHoldsItsDataOrSaysHowToGetUplot) {
  const fs::path dir = make_run("frozen", 1, 10);
  append(dir, line_of(train_line(5, 0, 4.0)));
  std::vector<study::RunWatch> runs;
  runs.emplace_back(dir, "frozen-run");
  study::DashboardPage page;
  page.embedded = study::dashboard_json(runs);
  if (!study::dashboard_assets_available()) {
    try {
      study::dashboard_html(page);
      FAIL() << "a build without uPlot wrote a page";
    } catch (const Error& e) {
      EXPECT_NE(e.hint().find("scripts/setup.sh"), std::string::npos) << e.hint();
    }
    return;
  }
  const std::string html = study::dashboard_html(page);
  EXPECT_NE(html.find("\"frozen-run\""), std::string::npos);
  EXPECT_NE(html.find("uPlot"), std::string::npos);
  EXPECT_EQ(html.find("\"dataUrl\":\"data.json\""), std::string::npos);  // frozen: no polling
  page.data_url = "data.json";
  EXPECT_NE(study::dashboard_html(page).find("\"dataUrl\":\"data.json\""), std::string::npos);
}

// A run directory whose name is not UTF-8 (Latin-1 "café") is served with U+FFFD in its
// name, and the other runs with it: nlohmann's dump() throws on such bytes.
TEST(Dashboard, RunDirectoryNamedInLatin1IsServedWithOthers) {
  const fs::path good = make_run("good", 1, 10), latin1 = good.parent_path() / "caf\xE9";
  fs::remove_all(latin1);
  fs::rename(make_run("latin1", 1, 10), latin1);  // made under a UTF-8 name: run.json holds the path
  append(latin1, line_of(train_line(5, 0, 4.0)));
  append(good, line_of(train_line(5, 0, 3.5)));
  std::vector<study::RunWatch> runs;
  runs.emplace_back(latin1, latin1.filename().string());
  runs.emplace_back(good, "good");
  const json data = study::dashboard_json(runs);

  const json served = json::parse(study::json_text(data));  // what /data.json answers
  ASSERT_EQ(served["runs"].size(), 2u);
  EXPECT_EQ(served["runs"][0]["name"], "caf\xEF\xBF\xBD");
  EXPECT_EQ(doubles(served["runs"][0]["workers"]["0"]["train_loss"]), (std::vector<double>{4.0}));
  EXPECT_EQ(doubles(served["runs"][1]["workers"]["0"]["train_loss"]), (std::vector<double>{3.5}));
  EXPECT_EQ(json::parse(study::json_for_html(data)), served);  // report --html embeds the same
}

// ---- The HTTP server ----

constexpr size_t kBigBody = 32 << 20;  // far more than loopback's socket buffers hold

// A server on 127.0.0.1 serving "/big" (kBigBody bytes) and anything else as "small", in a thread,
// until the test ends.
class ServerThread {
 public:
  explicit ServerThread(app::HttpLimits limits = {}, const std::vector<std::string>& extra_hosts = {})
      : server_("127.0.0.1", 0, extra_hosts, limits) {
    clear_interrupt();
    thread_ = std::thread([this] { server_.serve(answer); });
  }
  ~ServerThread() {
    request_interrupt();
    thread_.join();
    clear_interrupt();
  }
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;
  int port() const { return server_.port(); }

 private:
  static app::HttpResponse answer(const std::string& path) {
    if (path == "/big") return {200, "application/octet-stream", std::string(kBigBody, 'x')};
    return {200, "text/plain", "small"};
  }
  app::HttpServer server_;
  std::thread thread_;
};

// A closed-on-exit client socket connected to 127.0.0.1:port.
struct Client {
  int fd;
  explicit Client(int port) : fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
      throw std::runtime_error(std::string("cannot connect: ") + std::strerror(errno));
  }
  ~Client() { ::close(fd); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send_text(const std::string& text) const {
    ASSERT_EQ(::send(fd, text.data(), text.size(), MSG_NOSIGNAL), static_cast<ssize_t>(text.size()));
  }
  void request(const std::string& path, const std::string& host = "127.0.0.1") const {
    send_text("GET " + path + " HTTP/1.1\r\n" + (host.empty() ? "" : "Host: " + host + "\r\n") + "\r\n");
  }
  // Up to `max` bytes; "" once the server closed (or reset) the connection. Waits at most `limit`
  // for them, and says so: a server that stopped answering fails the test instead of hanging it.
  std::string receive(size_t max, std::chrono::seconds limit, bool* waited_out = nullptr) const {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(limit).count()));
    if (waited_out) *waited_out = ready == 0;
    if (ready <= 0) return {};
    std::string buf(max, '\0');
    const ssize_t n = ::recv(fd, buf.data(), max, 0);
    buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return buf;
  }
  // The whole answer to a small request: what comes until the server closes.
  std::string answer(std::chrono::seconds limit = std::chrono::seconds(20)) const {
    std::string all;
    for (std::string part; !(part = receive(1 << 16, limit)).empty();) all += part;
    return all;
  }
};

std::string status_line(const std::string& response) { return response.substr(0, response.find("\r\n")); }

std::string get(int port, const std::string& path, const std::string& host = "127.0.0.1") {
  Client c(port);
  c.request(path, host);
  return c.answer();
}

// A client that takes a large answer a little at a time (16 KiB every 20 ms: steady progress, so
// no per-send timeout ever fires) must not keep the one-thread server from answering another.
TEST(DashboardServer, SlowReaderDoesNotHoldUpOtherClients) {
  ServerThread server;
  Client slow(server.port());
  slow.request("/big");
  ASSERT_EQ(status_line(slow.receive(4096, std::chrono::seconds(20))), "HTTP/1.1 200 OK");  // being answered now
  std::atomic<bool> other_answered{false};
  std::thread reader([&] {
    while (!other_answered && !slow.receive(16 << 10, std::chrono::seconds(1)).empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  // At this pace the slow answer would last 40 s, longer than this client waits (20 s).
  const std::string other = get(server.port(), "/small");
  other_answered = true;
  reader.join();
  EXPECT_EQ(status_line(other), "HTTP/1.1 200 OK") << "the server answered nobody while a slow client read";
}

// However steadily a client reads, its answer is cut off at the send deadline.
TEST(DashboardServer, SendDeadlineEndsASlowAnswer) {
  app::HttpLimits limits;
  limits.send_deadline = std::chrono::seconds(1);
  ServerThread server(limits);
  Client slow(server.port());
  slow.request("/big");
  size_t received = 0;
  bool waited_out = false;
  for (std::string part; !(part = slow.receive(1 << 16, std::chrono::seconds(20), &waited_out)).empty();) {
    received += part.size();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // 3 MiB/s: 10 s for the whole answer
  }
  EXPECT_FALSE(waited_out) << "the server neither sent nor closed for 20 s";
  EXPECT_GT(received, 0u);
  EXPECT_LT(received, kBigBody) << "a slow reader took a whole answer past a 1 s send deadline";
}

// More idle connections than the cap (a browser's pre-connections, or a client that opens many
// and sends nothing): the oldest idle ones are dropped, and a real request is still answered.
TEST(DashboardServer, IdleConnectionsDoNotLockOutARequest) {
  ServerThread server;
  std::vector<std::unique_ptr<Client>> idle;
  for (size_t i = 0; i < app::HttpLimits{}.max_connections + 4; ++i) {
    idle.push_back(std::make_unique<Client>(server.port()));
    if (i % 2) idle.back()->send_text("GET / HTTP/1.1\r\n");  // half a head, then silence
  }
  EXPECT_EQ(status_line(get(server.port(), "/small")), "HTTP/1.1 200 OK");
  // The oldest idle connection was the one dropped.
  EXPECT_EQ(idle.front()->answer(), "");
}

// DNS rebinding: a page of another site whose name resolves to 127.0.0.1 sends its own Host.
TEST(DashboardServer, OnlyItsOwnHostNamesAreServed) {
  ServerThread server({}, {"trainbox"});
  const std::string port = std::to_string(server.port());
  using Hosts = std::vector<std::string>;
  for (const std::string& host :
       Hosts{"127.0.0.1", "127.0.0.1:" + port, "localhost", "LocalHost:8080", "[::1]", "[::1]:80", "trainbox:" + port})
    EXPECT_EQ(status_line(get(server.port(), "/", host)), "HTTP/1.1 200 OK") << host;
  for (const std::string& host : Hosts{"evil.example", "evil.example:" + port, "localhost.evil.example",
                                       "127.0.0.1:80x", "[::1", "::1", "127.0.0.2"}) {
    const std::string refused = get(server.port(), "/", host);
    EXPECT_EQ(status_line(refused), "HTTP/1.1 421 Misdirected Request") << host;
    EXPECT_NE(refused.find("--allow-host"), std::string::npos) << refused;
  }
  EXPECT_EQ(status_line(get(server.port(), "/", "")), "HTTP/1.1 400 Bad Request");  // no Host at all
}

TEST(DashboardServer, HostRuleTakesTheListenAddress) {
  const std::vector<std::string> names = {"127.0.0.1", "localhost", "[::1]", "192.168.1.5"};  // --addr 192.168.1.5
  EXPECT_TRUE(app::host_is_allowed("192.168.1.5:8080", names));
  EXPECT_TRUE(app::host_is_allowed(" localhost ", names));
  EXPECT_FALSE(app::host_is_allowed("192.168.1.50", names));
  EXPECT_FALSE(app::host_is_allowed("", names));
  EXPECT_FALSE(app::host_is_allowed("localhost:", names));
  EXPECT_THROW(app::HttpServer("127.0.0.1", 0, {"trainbox:8080"}), Error);
}

}  // namespace
}  // namespace gasloc

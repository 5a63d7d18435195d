// Communication on loopback: the Gloo backend's exchange (1peer pairs 0-1, 2-3, ...; 2peer ring)
// and all-reduce of 25 MB and 100 MB fp32 buffers with 2, 4 and 8 processes, side by side with
// the same transfers over plain TCP sockets measured in the same run, so the ratio says how
// much of loopback's throughput the backend delivers.
//
//   build/bench_comm [--procs 2,4,8] [--sizes-mb 25,100] [--reps 3]
//
// --overlap: two ranks instead, each training the research regime's model (micro, batch 8 x 64,
// one BLAS thread each: the thread plan of 2 ranks on 2 cores) while a 25 MB exchange travels
// (start_exchange, algo.overlap_steps' path), against the step and the transfer alone.
//
//   build/bench_comm --overlap [--sizes-mb 25] [--reps 5]
//
// --codec: the codecs of compressed exchanges (comm/codec.hpp) on one thread, in GB/s of fp32
// input beside memcpy of the same buffer (bench/codec_bench.hpp); no ranks.
//
//   build/bench_comm --codec [--elements-m 1,100] [--reps 3]
//
// --secret: the exchanges and all-reduces of the tables with a job secret (every transfer sealed,
// the all-reduce an id-ordered reduction over sealed transfers) beside the same without, each
// process count run open then sealed; what a secret costs a round.
//
//   build/bench_comm --secret [--procs 2,4] [--sizes-mb 4,268] [--reps 3]
//
// --auth: HMAC-SHA256 and AES-256-GCM beside memcpy, and a store request and connection with and without a job
// secret (bench/auth_bench.hpp); no ranks.
//
//   build/bench_comm --auth [--reps 5]
//
// The binary launches its own ranks: it hosts a rendezvous store on a free port and re-executes
// itself once per rank with RANK/WORLD_SIZE/MASTER_* set (as gasloc launch would).
#include <arpa/inet.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "auth_bench.hpp"
#include "codec_bench.hpp"
#include "gasloc/comm/gloo.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/core/secret.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/optim/optimizer.hpp"

using namespace gasloc;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::vector<int> procs = {2, 4, 8};
  std::vector<double> sizes_mb = {25, 100};
  int reps = 3;
  bool overlap = false;    // the overlap bench instead of the tables
  bool codec = false;      // the codec bench instead of the tables
  bool auth = false;       // the job-secret bench instead of the tables
  bool secret = false;     // the tables open and sealed, side by side
  std::vector<double> elements_m = {1, 100};  // --codec: buffer sizes in millions of elements
  double limit_gbit = 0;   // --overlap: each rank's link limited to this rate (gasloc launch --bandwidth-limit); 0 = none
  std::string worker_out;  // set in a rank process
};

// Parses the command line into a; returns an exit code to leave with (--help, a bad option), or -1.
int parse(int argc, char** argv, Args& a) {
  CLI::App app{"Gloo collectives and exchanges on loopback against plain TCP sockets moving the same bytes"};
  app.add_option("--procs", a.procs, "process counts, comma-separated")->delimiter(',')->check(CLI::Range(2, 64))->capture_default_str();
  app.add_option("--sizes-mb", a.sizes_mb, "buffer sizes in MB, comma-separated")->delimiter(',')->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--reps", a.reps, "timed repetitions (median reported) after a warm-up")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--overlap", a.overlap, "two ranks: a training step while an exchange travels, against each alone");
  app.add_option("--limit-gbit", a.limit_gbit, "with --overlap: each rank's link limited to this rate (Gbit/s; 0 = loopback's own)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--codec", a.codec, "the codecs' encode and decode speed on one thread, against memcpy");
  app.add_flag("--auth", a.auth, "HMAC-SHA256 and AES-256-GCM against memcpy, and store requests with and without a job secret");
  app.add_flag("--secret", a.secret, "the exchanges and all-reduces open and with a job secret (sealed), side by side");
  app.add_option("--elements-m", a.elements_m, "with --codec: buffer sizes in millions of fp32 elements, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--worker-out", a.worker_out, "internal: set in the rank processes bench_comm launches")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int> pair_peers(int r, int n) { return (r ^ 1) < n ? std::vector<int>{r ^ 1} : std::vector<int>{}; }
std::vector<int> ring_peers(int r, int n) {
  return n == 2 ? std::vector<int>{1 - r} : std::vector<int>{(r + n - 1) % n, (r + 1) % n};
}

// ---- raw TCP -------------------------------------------------------------------------------

// A connected pair of loopback TCP sockets.
std::pair<int, int> socket_pair() {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("raw: cannot listen");
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("raw: cannot connect");
  const int s = ::accept(ls, nullptr, nullptr);
  ::close(ls);
  for (int fd : {c, s}) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return {c, s};
}

// One rank's side of the raw transfers: for each socket, bytes to send and to receive.
struct RawEnd {
  int fd;
  size_t to_send, to_recv;
  char* dst;
};

// Moves every end's bytes with non-blocking sockets and poll(), one thread per rank: the design
// of Gloo's TCP transport (one event loop per process) with nothing else on top.
void run_rank(std::vector<RawEnd> ends, const char* src) {
  std::vector<size_t> sent(ends.size(), 0), got(ends.size(), 0);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> idx;
    for (size_t i = 0; i < ends.size(); ++i) {
      short ev = 0;
      if (sent[i] < ends[i].to_send) ev |= POLLOUT;
      if (got[i] < ends[i].to_recv) ev |= POLLIN;
      if (ev) fds.push_back({ends[i].fd, ev, 0}), idx.push_back(i);
    }
    if (fds.empty()) return;
    ::poll(fds.data(), fds.size(), 1000);
    for (size_t k = 0; k < fds.size(); ++k) {
      auto& e = ends[idx[k]];
      const size_t i = idx[k];
      if (fds[k].revents & POLLIN) {
        const ssize_t n = ::recv(e.fd, e.dst + got[i], e.to_recv - got[i], MSG_DONTWAIT);
        if (n > 0) got[i] += static_cast<size_t>(n);
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) throw std::runtime_error("raw: recv failed");
      }
      if (fds[k].revents & POLLOUT) {
        const ssize_t n = ::send(e.fd, src + sent[i], e.to_send - sent[i], MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) sent[i] += static_cast<size_t>(n);
        else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) throw std::runtime_error("raw: send failed");
      }
    }
  }
}

// Seconds to move `bytes` over each directed link (from, to) of n ranks at once (ranks as
// threads, each running its own event loop; receive buffers touched beforehand): what the
// backend's transfers cost with nothing but TCP. Median of `reps` after a warm-up.
double raw_seconds(int n, const std::vector<std::pair<int, int>>& links, size_t bytes, int reps) {
  std::vector<char> src(bytes, 1);
  // An exchange's two directions over an edge share one connection, as Gloo's pair does.
  std::map<std::pair<int, int>, std::pair<int, int>> conn;  // (lo, hi) -> (fd at lo, fd at hi)
  for (auto [a, b] : links) {
    const auto key = std::minmax(a, b);
    if (!conn.count(key)) conn[key] = socket_pair();
  }
  std::vector<std::vector<char>> dst;
  dst.reserve(links.size());
  std::vector<std::vector<RawEnd>> ends(n);
  auto end_of = [&](int r, int fd) -> RawEnd& {
    for (auto& e : ends[r])
      if (e.fd == fd) return e;
    return ends[r].emplace_back(RawEnd{fd, 0, 0, nullptr});
  };
  for (auto [a, b] : links) {
    const auto key = std::minmax(a, b);
    const int fa = a < b ? conn[key].first : conn[key].second, fb = a < b ? conn[key].second : conn[key].first;
    end_of(a, fa).to_send += bytes;
    dst.emplace_back(bytes, 0);
    RawEnd& eb = end_of(b, fb);
    eb.to_recv += bytes;
    eb.dst = dst.back().data();
  }
  std::vector<double> times;
  for (int rep = 0; rep <= reps; ++rep) {
    std::barrier sync(n + 1);
    std::vector<std::thread> th;
    for (int r = 0; r < n; ++r)
      th.emplace_back([&, r] {
        sync.arrive_and_wait();
        run_rank(ends[r], src.data());
      });
    const auto t0 = Clock::now();
    sync.arrive_and_wait();
    for (auto& t : th) t.join();
    if (rep > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  for (auto& [k, fds] : conn) ::close(fds.first), ::close(fds.second);
  return median(times);
}

// The directed links of each pattern: an exchange moves the buffer both ways over each edge;
// a ring all-reduce moves 2(n-1)/n of it one way around the ring.
std::vector<std::pair<int, int>> links_of(const std::string& op, int n) {
  std::vector<std::pair<int, int>> l;
  for (int r = 0; r < n; ++r) {
    if (op == "allreduce") l.emplace_back(r, (r + 1) % n);
    else
      for (int p : op == "pairs" ? pair_peers(r, n) : ring_peers(r, n)) l.emplace_back(r, p);
  }
  return l;
}

// ---- a rank ----------------------------------------------------------------------------------

// An operation ends when its slowest rank is done: every rank's time gathered (rank r fills slot
// r; the mean times n is the vector of times), the largest kept.
double slowest(comm::Communicator& c, double seconds) {
  auto t = torch::zeros({c.world()}, torch::kDouble);
  t[c.rank()] = seconds;
  c.all_reduce_mean(t);
  return t.max().item<double>() * c.world();
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One inner step of the research regime (configs/research.toml): the micro model on a batch of
// 8 x 64 tokens, forward, backward, clip and AdamW.
class InnerStep {
 public:
  InnerStep() : cfg_(config()), m_(cfg_), flat_(m_->hf_parameters()), opt_(flat_, optim::AdamWOptions{}) {
    x_ = torch::randint(0, cfg_.vocab_size, {8, 64}, torch::kInt64);
    y_ = x_.roll(1, 1);
  }
  double operator()() {
    const auto t0 = Clock::now();
    flat_.zero_grad();
    m_->loss(x_, y_).backward();
    optim::clip_grad_norm(flat_.grad(), 1.0);
    opt_.step(1e-3);
    return since(t0);
  }

 private:
  static model::LlamaConfig config() {
    auto cfg = model::LlamaConfig::preset("micro");
    cfg.vocab_size = 1024;
    return cfg;
  }
  model::LlamaConfig cfg_;
  model::Llama m_;
  FlatParams flat_;
  optim::AdamW opt_;
  torch::Tensor x_, y_;
};

// Two ranks, one BLAS thread each. Per buffer size, the slowest rank's medians of: a step alone;
// the exchange alone; k steps run while an overlapped exchange travels (k: as many steps as the
// exchange alone lasts, at least 1) and the whole overlapped window; the exchange while a thread
// of the same process trains beside it.
int overlap_worker(const Args& a) {
  auto opts = comm::gloo_options_from_env();
  opts.timeout_s = 300;
  opts.bandwidth_limit_Bps = a.limit_gbit * 1e9 / 8;
  comm::GlooCommunicator c(opts);
  BlasThreads one_thread(1);
  torch::set_num_threads(1);
  const int peer = 1 - c.rank();
  InnerStep step;
  nlohmann::json out = nlohmann::json::array();
  for (double mb : a.sizes_mb) {
    const torch::Tensor send = torch::ones({static_cast<int64_t>(mb * 1e6 / 4)});
    std::vector<torch::Tensor> recv;
    std::map<std::string, std::vector<double>> t;
    int k = 1;
    // Two warm-ups: the first allocates, the second fixes k from warm times.
    for (int rep = -1; rep <= a.reps; ++rep) {
      c.barrier();
      const double alone = slowest(c, step());
      c.barrier();
      auto t0 = Clock::now();
      c.exchange({peer}, send, recv);
      const double xfer = slowest(c, since(t0));
      if (rep == 0) k = std::max(1, static_cast<int>(std::lround(xfer / alone)));  // from warm times
      c.barrier();
      t0 = Clock::now();
      auto pending = c.start_exchange({peer}, send, recv);
      double stepping = 0;
      for (int i = 0; i < k; ++i) stepping += step();
      pending->wait();
      const double window = slowest(c, since(t0)), beside = slowest(c, stepping / k);
      c.barrier();
      std::atomic<bool> stop{false};
      std::thread trainer([&] {
        while (!stop.load()) step();
      });
      t0 = Clock::now();
      c.exchange({peer}, send, recv);
      const double loaded = since(t0);
      stop = true;
      trainer.join();
      const double xfer_beside = slowest(c, loaded);
      if (rep <= 0) continue;
      t["step"].push_back(alone), t["xfer"].push_back(xfer), t["window"].push_back(window);
      t["step_beside"].push_back(beside), t["xfer_beside"].push_back(xfer_beside);
    }
    nlohmann::json row = {{"mb", mb}, {"k", k}};
    for (auto& [key, v] : t) row[key] = median(v);
    out.push_back(row);
  }
  if (c.rank() == 0) std::ofstream(a.worker_out) << out.dump() << "\n";
  return 0;
}

void print_overlap(const nlohmann::json& rows) {
  fmt::print("\n| MB | step alone ms | step while the exchange travels ms | exchange alone ms | exchange beside "
             "training ms | k steps | k steps then the exchange ms | overlapped ms | hidden |\n"
             "|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : rows) {
    const double step = r["step"], xfer = r["xfer"], window = r["window"];
    const int k = r["k"];
    const double serial = k * step + xfer;
    // The part of the shorter of the two that the overlap took off the serial time.
    const double hidden = (serial - window) / std::min(k * step, xfer);
    fmt::print("| {} | {:.1f} | {:.1f} ({:.2f}x) | {:.1f} | {:.1f} ({:.2f}x) | {} | {:.1f} | {:.1f} | {:.0f}% |\n",
               r["mb"].get<double>(), step * 1e3, r["step_beside"].get<double>() * 1e3,
               r["step_beside"].get<double>() / step, xfer * 1e3, r["xfer_beside"].get<double>() * 1e3,
               r["xfer_beside"].get<double>() / xfer, k, serial * 1e3, window * 1e3, 100 * hidden);
  }
}

int worker(const Args& a) {
  auto opts = comm::gloo_options_from_env();
  opts.timeout_s = 300;  // large buffers on a loaded machine
  if (const char* hex = std::getenv("GASLOC_BENCH_SECRET")) {
    // --secret: a throwaway secret of this bench's own (a real job hands its ranks a file's path).
    std::string secret;
    for (size_t i = 0; i + 1 < std::strlen(hex); i += 2) secret.push_back(static_cast<char>(std::stoi(std::string(hex + i, 2), nullptr, 16)));
    opts.job = {std::getenv("GASLOC_BENCH_JOB"), "bench_comm", secret};
    opts.agent_store = false;
    opts.connect_only = true;
  }
  comm::GlooCommunicator c(opts);
  const int r = c.rank(), n = c.world();
  nlohmann::json out = nlohmann::json::array();
  for (double mb : a.sizes_mb) {
    const auto numel = static_cast<int64_t>(mb * 1e6 / 4);
    torch::Tensor send = torch::ones({numel}), buf = torch::ones({numel});
    std::vector<torch::Tensor> recv;
    for (const std::string op : {"pairs", "ring", "allreduce"}) {
      std::vector<double> times;
      for (int rep = 0; rep <= a.reps; ++rep) {
        c.barrier();
        const auto t0 = Clock::now();
        if (op == "allreduce") c.all_reduce_mean(buf);
        else c.exchange(op == "pairs" ? pair_peers(r, n) : ring_peers(r, n), send, recv);
        const double t = slowest(c, std::chrono::duration<double>(Clock::now() - t0).count());
        if (rep > 0) times.push_back(t);
      }
      if (r == 0) out.push_back({{"op", op}, {"n", n}, {"mb", mb}, {"seconds", median(times)}});
    }
  }
  if (r == 0) std::ofstream(a.worker_out) << out.dump() << "\n";
  return 0;
}

// Runs n rank processes of this binary; returns rank 0's results. sealed: with a job secret.
nlohmann::json run_ranks(const Args& a, int n, bool sealed = false) {
  const std::string secret = sealed ? crypto::random_bytes(32) : "", token = fmt::format("bench-{}-{}", ::getpid(), n);
  // Open, its ranks connect as to an agent store; sealed, to gasloc's store with the job's secret.
  comm::StoreHost host("127.0.0.1", 0, 300, sealed ? comm::JobIdentity{token, "bench_comm", secret} : comm::JobIdentity{},
                       /*c10d_protocol=*/!sealed);
  const std::string out = fmt::format("/tmp/bench_comm_{}_{}.json", ::getpid(), n);
  std::vector<std::string> sizes;
  for (double s : a.sizes_mb) sizes.push_back(fmt::format("{}", s));
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(host.port()).c_str(), 1);
      ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
      if (sealed) {
        std::string hex;
        for (unsigned char ch : secret) hex += fmt::format("{:02x}", ch);
        ::setenv("GASLOC_BENCH_SECRET", hex.c_str(), 1);
        ::setenv("GASLOC_BENCH_JOB", token.c_str(), 1);
      }
      const std::string reps = std::to_string(a.reps), sz = join(sizes);
      const std::string limit = fmt::format("{}", a.limit_gbit);
      ::execl("/proc/self/exe", "bench_comm", "--sizes-mb", sz.c_str(), "--reps", reps.c_str(), "--limit-gbit",
              limit.c_str(), "--worker-out", out.c_str(), a.overlap ? "--overlap" : static_cast<char*>(nullptr),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) throw std::runtime_error(fmt::format("a rank of the {}-process run failed", n));
  std::ifstream f(out);
  auto j = nlohmann::json::parse(f);
  std::remove(out.c_str());
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    if (const int rc = parse(argc, argv, a); rc >= 0) return rc;
    if (a.codec) {
      bench::run_codec_bench(a.elements_m, a.reps);
      return 0;
    }
    if (a.auth) {
      bench::run_auth_bench(a.reps);
      return 0;
    }
    if (!a.worker_out.empty()) return a.overlap ? overlap_worker(a) : worker(a);
    torch::set_num_threads(1);
    if (a.overlap) {
      fmt::print("bench_comm --overlap: 2 Gloo ranks on loopback{}, each training the micro model (batch 8 x 64, one "
                 "BLAS thread) on {} cores; the slowest rank's median of {} after two warm-ups\n",
                 a.limit_gbit > 0 ? fmt::format(" limited to {} Gbit/s per rank", a.limit_gbit) : "",
                 std::thread::hardware_concurrency(), a.reps);
      print_overlap(run_ranks(a, 2));
      return 0;
    }
    if (a.secret) {
      fmt::print("bench_comm --secret: Gloo on loopback, open and with a job secret (every transfer sealed with "
                 "AES-256-GCM; the all-reduce an id-ordered reduction over sealed transfers), {} cores; the slowest "
                 "rank's median of {} after a warm-up\n\n| op | procs | MB | open ms | sealed ms | sealed - open ms | "
                 "sealed / open |\n|---|---|---|---|---|---|---|\n",
                 std::thread::hardware_concurrency(), a.reps);
      for (int n : a.procs) {
        const auto open = run_ranks(a, n), sealed = run_ranks(a, n, /*sealed=*/true);
        for (size_t i = 0; i < open.size() && i < sealed.size(); ++i) {
          const std::string op = open[i]["op"];
          const double mb = open[i]["mb"], to = open[i]["seconds"], ts = sealed[i]["seconds"];
          const std::string label = op == "pairs" ? "exchange 1peer" : op == "ring" ? "exchange 2peer (ring)" : "all-reduce";
          fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.2f} |\n", label, n, mb, to * 1e3, ts * 1e3,
                     (ts - to) * 1e3, ts / to);
          std::fflush(stdout);
        }
      }
      return 0;
    }
    fmt::print("bench_comm: Gloo backend on loopback vs plain TCP sockets ({} cores; median of {} after a warm-up)\n",
               std::thread::hardware_concurrency(), a.reps);
    for (double mb : a.sizes_mb) {
      const double t = raw_seconds(2, {{0, 1}}, static_cast<size_t>(mb * 1e6), a.reps);
      fmt::print("raw loopback TCP, one socket pair, one direction, {} MB: {:.2f} GB/s\n", mb, mb * 1e6 / t / 1e9);
    }
    fmt::print("\n| op | procs | MB | Gloo ms | Gloo GB/s per rank | raw TCP ms (same transfers) | raw GB/s per rank | "
               "Gloo / raw |\n|---|---|---|---|---|---|---|---|\n");
    for (int n : a.procs) {
      const auto results = run_ranks(a, n);
      for (const auto& row : results) {
        const std::string op = row["op"];
        const double mb = row["mb"], t = row["seconds"];
        const auto bytes = static_cast<size_t>(mb * 1e6);
        // Bytes each rank sends: the buffer to each peer, or 2(n-1)/n of it for the all-reduce.
        const double k = op == "pairs" ? 1.0 : op == "ring" ? (n == 2 ? 1.0 : 2.0) : 2.0 * (n - 1) / n;
        const size_t per_link = op == "allreduce" ? static_cast<size_t>(bytes * k) : bytes;
        const double raw = raw_seconds(n, links_of(op, n), per_link, a.reps);
        const std::string label = op == "pairs" ? "exchange 1peer" : op == "ring" ? "exchange 2peer (ring)" : "all-reduce";
        fmt::print("| {} | {} | {} | {:.1f} | {:.2f} | {:.1f} | {:.2f} | {:.0f}% |\n", label, n, mb, t * 1e3,
                   k * bytes / t / 1e9, raw * 1e3, k * bytes / raw / 1e9, 100 * raw / t);
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_comm: {}\n", e.what());
    return 1;
  }
}

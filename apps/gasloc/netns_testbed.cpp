#include "netns_testbed.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "gasloc/core/error.hpp"

extern char** environ;

namespace gasloc::app {
namespace fs = std::filesystem;

int run_command(const std::vector<std::string>& argv, std::string* output) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw Error("cannot create a pipe to run " + argv.at(0));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 2);
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, cargs[0], &actions, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  std::string out;
  if (err == 0) {
    char buf[4096];
    for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(pipefd[0]);
  if (err != 0) {
    if (output) *output = fmt::format("cannot run {}: {}", argv[0], std::strerror(err));
    return 127;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {
std::string netns_name(int id, int rank) { return fmt::format("gasloc{}r{}", id, rank); }
std::string bridge_name(int id) { return fmt::format("glb{}", id); }
std::string veth_name(int id, int rank) { return fmt::format("glv{}r{}", id, rank); }

// Runs `argv`; on failure throws with its output and `hint`.
void must(const std::vector<std::string>& argv, const std::string& hint) {
  std::string out;
  if (run_command(argv, &out) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    out = out.substr(0, out.find_last_not_of(" \n") + 1);
    throw Error(fmt::format("launch --netns: `{}` failed: {}", cmd, out), hint);
  }
}

// tbf on `dev` (in namespace `ns`, "" = this one): `rate` bytes/s with a burst of 10 ms of
// traffic (at least 64 KiB, so that a segmentation-offloaded packet fits) and a queue of 100 ms.
std::vector<std::string> tbf(const std::string& ns, const std::string& dev, double rate_Bps) {
  std::vector<std::string> a = {"tc"};
  if (!ns.empty()) a.insert(a.end(), {"-n", ns});
  const auto burst = static_cast<long long>(std::max(65536.0, rate_Bps * 0.01));
  a.insert(a.end(), {"qdisc", "replace", "dev", dev, "root", "tbf", "rate", fmt::format("{}bit", static_cast<long long>(rate_Bps * 8)),
                     "burst", std::to_string(burst), "latency", "100ms"});
  return a;
}
}  // namespace

NetnsTestbed::NetnsTestbed(const std::vector<double>& bandwidth_Bps, bool keep) : keep_(keep), bandwidth_(bandwidth_Bps) {
  const int n = static_cast<int>(bandwidth_.size());
  if (n < 1 || n > 250) throw Error(fmt::format("launch --netns: {} ranks; the test bed holds 1 to 250", n));
  if (::geteuid() != 0)
    throw Error("launch --netns needs root: it creates network namespaces, a bridge and traffic shapers",
                "run it as root (sudo), or drop --netns to run the ranks on this host's loopback");
  std::string out;
  if (run_command({"ip", "-V"}, &out) != 0 || run_command({"tc", "-V"}, &out) != 0)
    throw Error("launch --netns needs the ip and tc commands (iproute2)", "apt-get install -y iproute2");
  // A free test-bed id: no namespace, bridge or cable of that number exists yet. The cables are
  // checked too: a namespace deleted by `ip netns del` takes its veth peers with it only when
  // the kernel's asynchronous namespace cleanup gets to it, which can be seconds on a busy host.
  auto is_free = [n](int id) {
    if (fs::exists("/run/netns/" + netns_name(id, 0)) || fs::exists("/sys/class/net/" + bridge_name(id))) return false;
    for (int r = 0; r < n; ++r)
      if (fs::exists("/sys/class/net/" + veth_name(id, r))) return false;
    return true;
  };
  const int start = static_cast<int>(::getpid() % 250);
  for (int k = 0; k < 250 && id_ < 0; ++k) {
    const int id = (start + k) % 250 + 1;
    if (is_free(id)) id_ = id;
  }
  if (id_ < 0) throw Error("launch --netns: every test-bed number is in use", "remove leftovers with gasloc launch --cleanup");
  try {
    const std::string br = bridge_name(id_);
    must({"ip", "link", "add", br, "type", "bridge"}, "this kernel may lack bridge support");
    must({"ip", "addr", "add", bridge_address() + "/24", "dev", br}, "");
    must({"ip", "link", "set", br, "up"}, "");
    for (int r = 0; r < n; ++r) {
      const std::string ns = netns_name(id_, r), veth = veth_name(id_, r);
      must({"ip", "netns", "add", ns}, "network namespaces must be available (a container may forbid them)");
      must({"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns}, "");
      must({"ip", "link", "set", veth, "master", br}, "");
      must({"ip", "link", "set", veth, "up"}, "");
      must({"ip", "-n", ns, "addr", "add", host_address(r) + "/24", "dev", "eth0"}, "");
      must({"ip", "-n", ns, "link", "set", "eth0", "up"}, "");
      must({"ip", "-n", ns, "link", "set", "lo", "up"}, "");
      if (bandwidth_[r] > 0) {
        // Egress: eth0 inside the host; ingress: the bridge's side of its cable.
        must(tbf(ns, "eth0", bandwidth_[r]), "the tbf qdisc must be available (kernel module sch_tbf)");
        must(tbf("", veth, bandwidth_[r]), "the tbf qdisc must be available (kernel module sch_tbf)");
      }
      const int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw Error(fmt::format("launch --netns: cannot open /run/netns/{}: {}", ns, std::strerror(errno)));
      fds_.push_back(fd);
    }
  } catch (...) {
    keep_ = false;
    teardown();
    throw;
  }
}

NetnsTestbed::~NetnsTestbed() { teardown(); }

void NetnsTestbed::teardown() noexcept {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
  if (keep_ || id_ < 0) return;
  try {
    // Each cable first: deleting a veth removes both its ends at once, while a deleted namespace
    // releases its end only when the kernel's asynchronous cleanup runs.
    for (size_t r = 0; r < bandwidth_.size(); ++r) {
      run_command({"ip", "link", "del", veth_name(id_, static_cast<int>(r))});
      run_command({"ip", "netns", "del", netns_name(id_, static_cast<int>(r))});
    }
    run_command({"ip", "link", "del", bridge_name(id_)});
  } catch (...) {
  }
}

std::string NetnsTestbed::host_address(int rank) const { return fmt::format("198.18.{}.{}", id_, rank + 1); }
std::string NetnsTestbed::bridge_address() const { return fmt::format("198.18.{}.254", id_); }
std::string NetnsTestbed::netns(int rank) const { return netns_name(id_, rank); }

std::string NetnsTestbed::describe() const {
  std::string s = fmt::format("launch --netns: {} hosts on bridge {} ({}):", bandwidth_.size(), bridge_name(id_), bridge_address());
  for (size_t r = 0; r < bandwidth_.size(); ++r)
    s += fmt::format(" rank {} {} {};", r, host_address(static_cast<int>(r)),
                     bandwidth_[r] > 0 ? fmt::format("{:.3g} MB/s", bandwidth_[r] / 1e6) : std::string("unshaped"));
  s.back() = '\n';
  return s;
}

int NetnsTestbed::cleanup_leftovers() {
  int removed = 0;
  std::error_code ec;
  // Cables and bridges first: a deleted namespace frees its cable ends only later (above).
  for (const auto& e : fs::directory_iterator("/sys/class/net", ec)) {
    const std::string name = e.path().filename().string();
    const bool bridge = name.rfind("glb", 0) == 0 && name.size() > 3 && std::all_of(name.begin() + 3, name.end(), ::isdigit);
    const bool cable = name.rfind("glv", 0) == 0 && name.find('r') != std::string::npos;
    if ((bridge || cable) && run_command({"ip", "link", "del", name}) == 0) ++removed;
  }
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("gasloc", 0) == 0 && name.find('r') != std::string::npos && run_command({"ip", "netns", "del", name}) == 0)
      ++removed;
  }
  return removed;
}

}  // namespace gasloc::app

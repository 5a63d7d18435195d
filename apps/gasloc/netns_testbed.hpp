// A test bed of real shaped links on one machine, for `gasloc launch --netns`: every rank runs in
// its own network namespace (a "host" with its own address and interface eth0), all hosts hang
// on a private bridge made for the run, and each host's egress and ingress are held to its
// bandwidth by tbf qdiscs. Traffic never leaves the bridge: it has no uplink.
//
//   host r:  netns gasloc<X>r<r>, eth0 = 198.18.X.(r+1)/24   (198.18.0.0/15: the benchmarking range)
//   bridge:  glb<X> = 198.18.X.254, where the launcher hosts the rendezvous store
//
// Needs root, `ip` and `tc` (iproute2) and the tbf qdisc; netem is not needed (latency stays on
// the virtual clock). Everything is removed when the object dies; leftovers of a launcher that
// was killed are removed by cleanup_leftovers() (`gasloc launch --cleanup`).
#pragma once
#include <string>
#include <vector>

namespace gasloc::app {

class NetnsTestbed {
 public:
  // bandwidth_Bps[r]: rank r's link in bytes/s, each way (0 = unshaped). Throws gasloc::Error
  // saying what is missing (root, iproute2, network namespaces, tbf) and removes what it made.
  NetnsTestbed(const std::vector<double>& bandwidth_Bps, bool keep);
  ~NetnsTestbed();
  NetnsTestbed(const NetnsTestbed&) = delete;
  NetnsTestbed& operator=(const NetnsTestbed&) = delete;

  int size() const { return static_cast<int>(fds_.size()); }
  std::string host_address(int rank) const;
  std::string bridge_address() const;
  std::string netns(int rank) const;
  // An open descriptor of rank's namespace, for setns() in the child between fork and exec.
  int netns_fd(int rank) const { return fds_.at(static_cast<size_t>(rank)); }
  // A one-line description of the hosts and their links, for the launcher's output.
  std::string describe() const;

  // Removes every namespace and bridge a gasloc test bed made (names gasloc<X>r<i>, glb<X>);
  // returns how many were removed.
  static int cleanup_leftovers();

 private:
  void teardown() noexcept;

  int id_ = -1;
  bool keep_ = false;
  std::vector<double> bandwidth_;
  std::vector<int> fds_;
};

// Runs a command with an argument vector (no shell); returns its exit status and puts its
// stderr (and stdout) in `output`.
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr);

}  // namespace gasloc::app

#include "launch_outcome.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>

#include "gasloc/comm/rendezvous.hpp"

namespace gasloc::app {

namespace {
// The failed rank's last lines, the other ranks' ends, and the rank its record blames first.
int report_failure(const std::vector<Rank>& ranks, int first_failed, c10d::Store& store, int world) {
  const Rank& f = ranks[first_failed];
  std::string msg = fmt::format("launch: rank {} of {} failed with {}. {}\n", f.index, world, describe_status(f.status),
                                f.tail.empty() ? "It printed nothing." : fmt::format("Its last {} lines:", f.tail.size()));
  for (const auto& line : f.tail) msg += "  | " + line + "\n";
  // The others: one line each, plus the last lines of those that exited on their own (not
  // by our signal): their errors say what they saw, and when two ranks failed at the same
  // moment the launcher cannot tell which came first.
  for (const auto& r : ranks) {
    if (&r == &f || !failed(r.status)) continue;
    msg += fmt::format("launch: rank {} ended with {}{}\n", r.index, describe_status(r.status),
                       WIFEXITED(r.status) && !r.tail.empty() ? "; its last lines:" : "");
    if (!WIFEXITED(r.status)) continue;
    for (size_t k = r.tail.size() > 5 ? r.tail.size() - 5 : 0; k < r.tail.size(); ++k) msg += "  | " + r.tail[k] + "\n";
  }
  // The first rank to exit may have failed because of another one (a stuck rank makes its peers
  // time out first): its record in the store names the rank that failed first.
  if (const auto rec = comm::read_failure(store, f.index); rec && rec->root >= 0 && rec->root != f.index)
    msg += fmt::format("launch: rank {} reports that rank {} failed first: {}\n", f.index, rec->root, rec->what);
  write_all(2, msg);
  return exit_code(f.status);
}
}  // namespace

int fixed_outcome(const Supervised& s, const std::vector<Rank>& ranks, c10d::Store& store, int world) {
  if (s.first_failed >= 0) return report_failure(ranks, s.first_failed, store, world);
  if (!s.interrupted) return 0;
  for (const auto& r : ranks)
    if (failed(r.status)) return exit_code(r.status);
  return 130;
}

int elastic_outcome(const comm::ElasticHost& e, const Supervised& s, const std::vector<Rank>& ranks, c10d::Store& store,
                    int world) {
  const int code = s.first_failed >= 0 ? report_failure(ranks, s.first_failed, store, world) : 0;
  std::vector<int> unfinished, left;
  for (int id = 0; id < world; ++id) {
    write_all(2, fmt::format("launch: rank {}: {}\n", id, e.story(id).empty() ? "never ended" : fmt::format("{}", fmt::join(e.story(id), "; "))));
    if (e.left(id)) left.push_back(id);
    else if (!e.ended_well(id)) unfinished.push_back(id);
  }
  if (code != 0) return code;
  if (s.interrupted) {
    write_all(2, "launch: the job stopped as asked (interrupted); resume it with gasloc train --resume RUN\n");
    return 130;
  }
  if (!unfinished.empty()) {
    write_all(2, fmt::format("launch: the job did not finish: rank(s) {} ended with an error (above)\n", fmt::join(unfinished, ", ")));
    return 1;
  }
  if (!left.empty()) {
    write_all(2, fmt::format("launch: the job finished; rank(s) {} left it before the end (announced, with a checkpoint; "
                             "their output says why)\n", fmt::join(left, ", ")));
    return 0;
  }
  write_all(2, "launch: the job finished: every rank ended well\n");
  return 0;
}

}  // namespace gasloc::app

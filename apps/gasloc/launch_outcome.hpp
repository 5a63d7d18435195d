// How `gasloc launch` ends: what it says about the ranks and the exit status it returns.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <vector>

#include "gasloc/comm/elastic_host.hpp"
#include "rank_process.hpp"

namespace gasloc::app {

// What the supervision of the ranks came to.
struct Supervised {
  int first_failed = -1;  // the entry of the ranks whose failure stopped the job (-1: none)
  bool interrupted = false;
};

// A fixed world's end: the failure that stopped the job (its rank's last lines, the other ranks'
// ends, the rank its record blames first) and that rank's status; after an interrupt, the first
// failed rank's status or 130; else 0.
int fixed_outcome(const Supervised& s, const std::vector<Rank>& ranks, c10d::Store& store, int world);
// An elastic job's end: one line per rank saying what each of its incarnations did, then the
// exit status: 0 only when every rank's newest incarnation ended well (finished, or found the
// job finished), 130 after an interrupt, the stopping rank's status when the job was stopped,
// else 1.
int elastic_outcome(const comm::ElasticHost& e, const Supervised& s, const std::vector<Rank>& ranks, c10d::Store& store,
                    int world);

}  // namespace gasloc::app

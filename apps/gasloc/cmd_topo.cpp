#include <fmt/format.h>

#include <cmath>
#include <map>

#include "commands.hpp"
#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/compressed_consensus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/topology/spectral.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::app {

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

void print_round(const topology::Topology& t, int64_t round) {
  const int n = t.size();
  if (t.is_random()) {
    const auto pi = t.permutation(round);
    if (n <= 64) fmt::print("permutation pi_{}: [{}]\n", round, join(pi));
  }
  if (n <= 16) {
    const auto w = t.mixing_matrix(round);
    fmt::print("mixing matrix W_{} (row i: the weights worker i gives each worker; . = 0):\n     ", round);
    for (int j = 0; j < n; ++j) fmt::print("{:>6}", j);
    fmt::print("\n");
    for (int i = 0; i < n; ++i) {
      fmt::print("{:>5}", i);
      for (int j = 0; j < n; ++j) {
        const double v = w[i * n + j];
        if (v == 0.0) fmt::print("{:>6}", ".");
        else fmt::print("{:>6.3f}", v);
      }
      fmt::print("\n");
    }
    return;
  }
  // Summarize rows by their number of nonzeros (each row's weights are all equal).
  std::map<size_t, int> by_size;
  for (const auto& row : t.mixing_rows(round)) ++by_size[row.size()];
  fmt::print("mixing matrix W_{} omitted (n > 16):", round);
  for (auto [size, count] : by_size) fmt::print(" {} row(s) with {} weight(s) of {:.4g};", count, size, 1.0 / size);
  const int shown = std::min(n, 8);
  fmt::print(" peers of ranks 0..{}:\n", shown - 1);
  for (int i = 0; i < shown; ++i) fmt::print("  {:>5}: [{}]\n", i, join(t.peers(i, round)));
}

struct TopoOptions {
  std::string topology;
  int n = 0;
  uint64_t seed = 1337;
  int64_t round = 0;
  int64_t rounds = 2000;
  std::string preset = "tiny";
  std::string wire_dtype = "fp32";
  std::string compression = "none", gossip_codec = "delta";
  int64_t reference_every = 5;
  int64_t consensus = 0;
  double outer_lr = 1.0, outer_momentum = 0.0, gossip_step = 1.0;
  std::string form = "anchor";
  bool optimize = false;
  int64_t dim = 0;
  double common_scale = 10.0;
};

// The [algo] keys these options stand for: GASLoC on --topology with --form and its step, and the codec.
algo::AlgoConfig gossip_config(const TopoOptions& o) {
  algo::AlgoConfig a;
  a.name = "gasloc";
  a.topology = o.topology;
  a.form = o.form;
  a.outer_lr = o.outer_lr;
  a.outer_momentum = o.outer_momentum;
  a.gossip_step = o.gossip_step;
  a.compression = o.compression;
  a.gossip_codec = o.gossip_codec;
  a.reference_every = o.reference_every;
  return a;
}

// The message and what a worker sends per round.
void print_cost(const topology::Topology& t, const TopoOptions& o, c10::ScalarType wire) {
  const int n = t.size();
  const int deg = topology::max_degree(t);
  const auto params = model::LlamaConfig::preset(o.preset).num_params();
  const auto bytes_per_param = static_cast<int64_t>(c10::elementSize(wire));
  const int64_t message = params * bytes_per_param;
  const double sent = topology::bytes_per_worker_per_round(t, message);
  fmt::print("degree: {}{}\n", deg,
             t.is_all_reduce() ? " (but run as a ring all-reduce)"
             : t.kind() == topology::Kind::one_peer && n % 2 ? " (one worker sits out each round)" : "");
  fmt::print("message: preset {} ({} parameters, default vocab) x {} bytes ({}) = {:.2f} MB\n", o.preset, params,
             bytes_per_param, o.wire_dtype, static_cast<double>(message) / 1e6);
  fmt::print("bytes sent per worker per round: {:.2f} MB ({})\n", sent / 1e6,
             t.is_all_reduce() ? "ring all-reduce, 2(n-1)/n x message" : fmt::format("{} x message", deg));
  if (o.compression == "none") {
    fmt::print("bits per parameter per round: {:.2f}\n", 8.0 * sent / static_cast<double>(params));
    return;
  }
  // A compressed round (algo.compression): the codec's payloads, as the trainer sends them.
  const algo::AlgoConfig a = gossip_config(o);
  a.validate_compression();
  const auto opts = *algo::compression_options(a);
  double bytes = 0;
  std::string how;
  if (t.is_all_reduce()) {
    bytes = static_cast<double>(algo::compressed_all_reduce_bytes(opts.codec, params, n));
    how = o.compression == "topk" ? "an all-gather of every member's payload" : "to chunk owners and back, 2(n-1) payloads of P/n";
  } else {
    bytes = static_cast<double>(deg) * static_cast<double>(algo::gossip_message_bytes(opts, params));
    how = fmt::format("{} x the {} codec's payload", deg, o.gossip_codec);
    if (opts.gossip == algo::GossipCodec::delta && opts.reference_every > 0) {
      const auto int8 = comm::Codec::int8(opts.codec.chunk);
      bytes += static_cast<double>(algo::compressed_all_reduce_bytes(int8, params, n)) / static_cast<double>(opts.reference_every);
      how += fmt::format(", and its reference's int8 all-reduce every {} rounds", opts.reference_every);
    } else if (opts.gossip == algo::GossipCodec::modulo) {
      how += "; plus an fp32 first round and the chunks resent after a wrap, which depend on the run";
    }
  }
  fmt::print("with algo.compression = {}: {:.2f} MB per worker per round ({}), {:.2f} bits per parameter per round, "
             "{:.1f}x fewer than fp32\n",
             o.compression, bytes / 1e6, how, 8.0 * bytes / static_cast<double>(params),
             sent / bytes * (4.0 / static_cast<double>(bytes_per_param)));
}

// The spectral gap and the consensus decay it predicts; returns the closed-form gap.
double print_gap(const topology::Topology& t, const TopoOptions& o) {
  const int n = t.size();
  const double gap = topology::spectral_gap(t, o.rounds);
  const double closed = topology::spectral_gap_closed_form(t);
  if (t.is_random())
    fmt::print("spectral gap 1 - lambda_2(E[W^T W]): {:.4f} (estimated over {} rounds; closed form {:.4f})\n", gap,
               o.rounds, closed);
  else
    fmt::print("spectral gap 1 - lambda_2(E[W^T W]): {:.4f} (exact, over {} round{})\n", gap, t.period(),
               t.period() == 1 ? "" : "s");
  const double decay = 1.0 - gap;
  if (decay < 1e-12)
    fmt::print("consensus decay factor per round: 0 (exact consensus after one round)\n");
  else
    fmt::print("consensus decay factor per round: {:.4f} (expected consensus distance shrinks 100x in ~{:.1f} rounds)\n",
               decay, std::log(0.01) / std::log(decay));
  if (t.kind() == topology::Kind::exp && n > 2)
    fmt::print("note: exp's product over {} consecutive rounds is exactly 11^T/n (exact consensus), which the gap "
               "of E[W^T W] does not show\n", t.period());
  return closed;
}

// --consensus: random vectors gossiped with the outer step, against the gap's prediction.
void print_consensus(const topology::Topology& t, const TopoOptions& o, algo::Form form, double closed) {
  const algo::OuterStep step{o.outer_lr, o.outer_momentum, form, o.gossip_step};
  const bool plain = form != algo::Form::accelerated && o.outer_lr == 1.0 && o.outer_momentum == 0.0;
  const int64_t dim = o.dim > 0 ? o.dim : 4096;  // the per-round contraction concentrates around its expectation
  // The closed form: the estimate over sampled rounds is biased low (see spectral.hpp).
  const double rate = 1.0 - closed;
  if (o.consensus <= 200) {
    const auto sim = algo::simulate_consensus(t, o.consensus, dim, o.seed, step);
    if (plain)
      fmt::print("pure gossip averaging, no training (consensus distance / initial; (1-gap)^t from the closed form):\n");
    else if (form == algo::Form::accelerated)
      fmt::print("gossip in the accelerated form (alpha {}, gamma {}), no training (consensus distance / initial; "
                 "(1-gap)^t of plain averaging, from the closed form):\n", o.gossip_step, o.outer_momentum);
    else
      fmt::print("gossip with GASLoC's outer step (lr {}, momentum {}{}), no training (consensus distance / initial; "
                 "(1-gap)^t of plain averaging, from the closed form):\n", o.outer_lr, o.outer_momentum,
                 form == algo::Form::mix_after ? ", form mix_after" : "");
    fmt::print("  {:>5} {:>12} {:>12} {:>8}\n", "round", "simulated", "(1-gap)^t", "ratio");
    for (size_t r = 0; r < sim.size(); ++r) {
      const double predicted = std::pow(rate, static_cast<double>(r));
      fmt::print("  {:>5} {:>12.4e} {:>12.4e} {:>8.3f}\n", r, sim[r], predicted, predicted > 0 ? sim[r] / predicted : 0.0);
    }
  }
  const auto c = algo::consensus_contraction(t, o.consensus, dim, o.seed, step);
  const auto c_plain = algo::consensus_contraction(t, o.consensus, dim, o.seed, {});
  const std::string setting = form == algo::Form::accelerated
                                  ? fmt::format("alpha {}, gamma {}", o.gossip_step, o.outer_momentum)
                                  : fmt::format("eta {}, mu {}", o.outer_lr, o.outer_momentum);
  fmt::print("per-round contraction of the consensus distance (geometric mean of d_t+1 / d_t over {} rounds, {} "
             "entries per worker): {:.4f} for form {} ({}){}; plain gossip {:.4f}; 1 - gap {:.4f} (closed form)\n",
             o.consensus, dim, c.geometric, o.form, setting, c.geometric > 1.0 ? " (diverges)" : "",
             c_plain.geometric, rate);
  fmt::print("mean of d_t+1 / d_t (1 - gap is plain gossip's expectation): {:.4f} for form {}; plain gossip {:.4f}\n",
             c.mean, o.form, c_plain.mean);
  if (c.restarts + c_plain.restarts > 0)
    fmt::print("note: exact consensus was reached {} time(s) (plain gossip {}); each time the run restarted from fresh "
               "vectors (that round counts as 0 in the mean and is left out of the geometric mean)\n",
               c.restarts, c_plain.restarts);
  if (form == algo::Form::mix_after)
    fmt::print("note: without training mix_after's pseudo-gradient theta - phi is 0, so its round is plain gossip\n");
}

// --consensus with --compression on a gossip graph: the codec's consensus beside uncompressed
// gossip, both through the synchronizers a training run uses (compressed_consensus.hpp).
void print_compressed_consensus(const topology::Topology& t, const TopoOptions& o) {
  constexpr int64_t kMaxRounds = 200;  // threads exchanging real payloads: seconds, not the float64 simulation's thousands
  const int64_t rounds = std::min(o.consensus, kMaxRounds);
  const int64_t dim = o.dim > 0 ? o.dim : 4096;
  const algo::AlgoConfig a = gossip_config(o);
  auto plain = a;
  plain.compression = "none";
  const auto base = algo::simulate_compressed_consensus(plain, t.size(), rounds, dim, o.seed, o.common_scale);
  const auto comp = algo::simulate_compressed_consensus(a, t.size(), rounds, dim, o.seed, o.common_scale);
  fmt::print("compressed gossip, no training: the {} codec over {} ({} entries per worker, each x_i = c + e_i with a "
             "shared c of std {} and a disagreement e_i of std 1; consensus distance / initial, and what the mean "
             "worker sent that round){}:\n",
             o.gossip_codec, o.compression, dim, o.common_scale,
             rounds < o.consensus ? fmt::format(", the first {} of the --consensus rounds", rounds) : "");
  fmt::print("  {:>5} {:>12} {:>12} {:>8} {:>10} {:>10}\n", "round", "fp32", o.compression + " " + o.gossip_codec, "ratio",
             "fp32 bits", "bits/param");
  for (int64_t r = 0; r <= rounds; ++r) {
    const bool shown = rounds <= 40 || r <= 10 || r % 10 == 0 || r == rounds;
    if (!shown) continue;
    const double f = base.distance[r], q = comp.distance[r];
    fmt::print("  {:>5} {:>12.4e} {:>12.4e} {:>8.3f} {:>10.2f} {:>10.2f}\n", r, f, q, f > 0 ? q / f : 0.0, base.bits[r],
               comp.bits[r]);
  }
  double bits = 0, fp32_bits = 0;
  for (int64_t r = 1; r <= rounds; ++r) bits += comp.bits[r], fp32_bits += base.bits[r];
  if (rounds > 0)
    fmt::print("after {} rounds: {} {} at {:.3g}x fp32's consensus distance, {:.2f} bits per parameter per round on "
               "average ({:.1f}x fewer than fp32){}\n",
               rounds, o.compression, o.gossip_codec,
               base.distance[rounds] > 0 ? comp.distance[rounds] / base.distance[rounds] : 0.0, bits / rounds,
               bits > 0 ? fp32_bits / bits : 0.0,
               o.gossip_codec == "modulo" ? fmt::format("; {} chunk(s) resent in fp32 after a wrap", comp.resends) : "");
}

// --optimize: each form's best per-round contraction over a grid of its outer step.
void print_optimized(const topology::Topology& t, const TopoOptions& o) {
  const int64_t dim = o.dim > 0 ? o.dim : 64;
  fmt::print("best per-round contraction (geometric mean of d_t+1 / d_t) over {} rounds ({} entries per worker; grid: eta or alpha 0.1..1.0 step "
             "0.1, mu or gamma 0..0.95 step 0.05):\n", o.consensus, dim);
  for (auto f : {algo::Form::anchor, algo::Form::accelerated}) {
    const auto best = algo::optimize_consensus(t, f, o.consensus, dim, o.seed);
    if (f == algo::Form::anchor)
      fmt::print("  anchor: {:.4f} at (eta {:.2f}, mu {:.2f}), {} points\n", best.rate.geometric, best.best.lr,
                 best.best.momentum, best.points);
    else
      fmt::print("  accelerated: {:.4f} at (alpha {:.2f}, gamma {:.2f}), {} points\n", best.rate.geometric,
                 best.best.gossip_step, best.best.momentum, best.points);
  }
  fmt::print("  mix_after: plain gossip at every (eta, mu), {:.4f} (no pseudo-gradient without training)\n",
             algo::consensus_contraction(t, o.consensus, dim, o.seed, {}).geometric);
}

}  // namespace

Action add_topo(CLI::App& app) {
  auto o = std::make_shared<TopoOptions>();
  app.add_option("--topology,-t", o->topology, topology::kind_choices().names())->required();
  app.add_option("-n,--workers", o->n, "number of workers")->required();
  app.add_option("--seed", o->seed, "gossip seed (every worker draws round t's graph from (seed, t))")->capture_default_str();
  app.add_option("--round", o->round, "round whose mixing matrix to print")->capture_default_str();
  app.add_option("--rounds", o->rounds, "rounds averaged to estimate the spectral gap of random graphs")->capture_default_str();
  app.add_option("--preset,-p", o->preset, "model preset whose parameters form the message")->capture_default_str();
  app.add_option("--wire-dtype", o->wire_dtype, algo::wire_dtype_choices().names() + ": bytes per parameter on the wire (algo.wire_dtype)")
      ->capture_default_str();
  app.add_option("--compression", o->compression, "none, int8, int4, topk: the round's bytes with this codec (algo.compression)")
      ->capture_default_str();
  app.add_option("--gossip-codec", o->gossip_codec, "with --compression on a gossip graph: delta, modulo, direct (algo.gossip_codec)")
      ->capture_default_str();
  app.add_option("--reference-every", o->reference_every, "with --gossip-codec delta: K (algo.reference_every)")->capture_default_str();
  app.add_option("--consensus", o->consensus,
                 "also gossip random vectors for this many rounds (no training) and print the consensus distance "
                 "against the (1 - gap)^t the spectral gap predicts");
  app.add_option("--outer-lr", o->outer_lr, "with --consensus: GASLoC's outer learning rate after each mixing (1 with "
                 "momentum 0 is plain averaging)")->capture_default_str();
  app.add_option("--outer-momentum", o->outer_momentum, "with --consensus: GASLoC's outer momentum (mu; gamma for accelerated)")
      ->capture_default_str();
  app.add_option("--form", o->form, "with --consensus: GASLoC form, " + algo::form_choices().names() + " (algo.form)")
      ->capture_default_str();
  app.add_option("--gossip-step", o->gossip_step, "with --consensus: the accelerated form's alpha (algo.gossip_step)")
      ->capture_default_str();
  app.add_flag("--optimize", o->optimize,
               "scan (eta, mu) for anchor and (alpha, gamma) for accelerated and print each form's best per-round "
               "contraction over --consensus rounds (default 2000)");
  app.add_option("--common-scale", o->common_scale,
                 "with --consensus and --compression: std of the vector every worker shares, in units of their "
                 "disagreement's (direct and delta codecs' error grows with it)")
      ->capture_default_str();
  app.add_option("--dim", o->dim, "entries per worker's vector in the consensus runs (default 4096; 64 with --optimize)");
  return [o]() {
    if (!(o->outer_lr > 0) || !(o->outer_momentum >= 0 && o->outer_momentum < 1))
      throw ConfigError(fmt::format("--outer-lr {} / --outer-momentum {}: the outer step needs lr > 0 and 0 <= momentum < 1",
                                    o->outer_lr, o->outer_momentum));
    if (!(o->gossip_step >= 0 && o->gossip_step <= 1))
      throw ConfigError(fmt::format("--gossip-step {}: alpha must be in [0, 1]", o->gossip_step));
    const auto wire = algo::parse_wire_dtype(o->wire_dtype);
    if (o->dim < 0) throw ConfigError("--dim must be >= 1");
    const auto form = algo::parse_form(o->form);
    if (o->optimize && o->consensus == 0) o->consensus = 2000;
    const topology::Topology t(topology::parse_kind(o->topology), o->n, o->seed);
    const int n = t.size();
    fmt::print("topology {} ({}), n = {}, seed {}\n", topology::to_string(t.kind()), topology::kind_choices().options().at(static_cast<size_t>(t.kind())).doc, n, o->seed);
    if (t.fell_back())
      fmt::print("note: {} needs n >= 3; with n = {} it fell back to {}\n", topology::to_string(t.requested_kind()), n,
                 topology::to_string(t.kind()));
    print_round(t, o->round);

    print_cost(t, *o, wire);
    const double closed = print_gap(t, *o);
    if (o->consensus > 0) print_consensus(t, *o, form, closed);
    if (o->consensus > 0 && o->compression != "none" && !t.is_all_reduce()) print_compressed_consensus(t, *o);
    if (o->optimize) print_optimized(t, *o);
    return 0;
  };
}

}  // namespace gasloc::app

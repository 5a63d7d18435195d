#include "gasloc/algo/algo_config.hpp"

#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

const config::Choices& h_policy_choices() {
  static const config::Choices c("local-step policy", {{"fixed", "H everywhere"}, {"time_budget", "H_i from [network]"}});
  return c;
}

const AlgoConfig::Docs& AlgoConfig::docs() {
  static const Docs d = [] {
    auto with = [](const std::string& doc, bool AlgorithmEntry::*flag) { return doc + " (" + algorithm_names(flag) + ")"; };
    Docs out;
    out.H = with("inner steps per round", &AlgorithmEntry::has_rounds);
    out.outer_lr = with("outer learning rate eta", &AlgorithmEntry::has_outer);
    out.outer_momentum = with("outer Nesterov momentum mu in [0, 1)", &AlgorithmEntry::has_outer);
    out.topology = with("gossip graph", &AlgorithmEntry::needs_topology);
    out.h_policy = with("local steps per round", &AlgorithmEntry::has_rounds);
    out.form = with("the round's form", &AlgorithmEntry::has_forms);
    out.overlap_steps = with("tau: local steps run while a round's exchange travels, its outer step landing tau steps "
                             "after the send (0 = off; needs every H_i >= tau + 1)",
                             &AlgorithmEntry::has_rounds);
    out.compression = "codec of parameter messages: none, int8, int4, topk (all-reduces only) (" +
                      algorithm_names(&AlgorithmEntry::sends_parameters) + ")";
    return out;
  }();
  return d;
}

void AlgoConfig::validate(int world) const {
  using config::require;
  const AlgorithmEntry& algo = algorithm(name);
  require(H >= 1, "algo.H", "must be >= 1, got " + std::to_string(H));
  require(outer_lr > 0, "algo.outer_lr", "must be > 0");
  require(outer_momentum >= 0 && outer_momentum < 1, "algo.outer_momentum", "must be in [0, 1)");
  require(h_policy == "fixed" || algo.has_rounds, "algo.h_policy",
          "time_budget applies to algorithms with rounds of local steps (" + algorithm_names(&AlgorithmEntry::has_rounds) +
              "), not '" + name.str() + "'");
  require(form == "anchor" || algo.has_forms, "algo.form",
          "applies to " + algorithm_names(&AlgorithmEntry::has_forms) + " only; '" + name.str() +
              "' has one form: leave algo.form = anchor");
  require(gossip_step >= 0 && gossip_step <= 1, "algo.gossip_step", "must be in [0, 1]");
  require(overlap_steps >= 0, "algo.overlap_steps", "must be >= 0 (0 = off), got " + std::to_string(overlap_steps));
  require(overlap_steps == 0 || algo.has_rounds, "algo.overlap_steps",
          "hides a round's exchange behind the next local steps of algorithms with outer rounds (" +
              algorithm_names(&AlgorithmEntry::has_rounds) + "); '" + name.str() +
              "' communicates every step: leave algo.overlap_steps = 0");
  require(overlap_steps == 0 || overlap_steps + 1 <= H, "algo.overlap_steps",
          "round t's outer step lands algo.overlap_steps steps into round t + 1, before its own send, so every round "
          "needs at least overlap_steps + 1 local steps: got algo.overlap_steps = " + std::to_string(overlap_steps) +
              " with algo.H = " + std::to_string(H) + "; lower algo.overlap_steps or raise algo.H");
  require(gossip_step == 1.0 || form == "accelerated", "algo.gossip_step",
          "is alpha of the accelerated form; with algo.form = " + form.str() + " leave it at 1");
  require(wire_dtype == "fp32" || !algo.sends_gradients, "algo.wire_dtype",
          "applies to parameter messages; " + name.str() + " averages gradients in fp32");
  validate_compression();
  validate_clip();
  if (world > 0)
    require(!algo.single_worker || world == 1, "algo.name",
            "'" + name.str() + "' trains one worker; choose one of " + algorithm_names(&AlgorithmEntry::single_worker, false) +
                " for " + std::to_string(world) + " workers");
  if (algo.needs_topology && world > 0) {
    try {
      topology::Topology(topology::parse_kind(topology), world, 0);  // throws if the graph cannot exist for n
    } catch (const ConfigError& e) {
      throw ConfigError("config key 'algo.topology': " + std::string(e.what()), e.hint());
    }
  }
}

}  // namespace gasloc::algo

namespace gasloc::algo {

void AlgoConfig::validate_compression() const {
  using config::require;
  const AlgorithmEntry& algo = algorithm(name);
  require(compression_chunk >= 0, "algo.compression_chunk", "must be >= 0 (0 = the codec's default)");
  require(topk_density > 0 && topk_density <= 1, "algo.topk_density", "must be in (0, 1]");
  require(error_feedback_decay >= 0 && error_feedback_decay <= 1, "algo.error_feedback_decay", "must be in [0, 1]");
  require(modulo_margin >= 2, "algo.modulo_margin", "must be >= 2: the grid must span twice the largest gap");
  require(reference_every >= 0, "algo.reference_every", "must be >= 0 (0: the reference is set on the first round only)");
  if (compression == "none") return;
  require(algo.sends_parameters, "algo.compression",
          "compresses parameter messages (" + algorithm_names(&AlgorithmEntry::sends_parameters) + "); '" + name.str() +
              (algo.sends_gradients ? "' averages every step's gradients, which stay fp32 (an error in them is not corrected "
                                      "by the next round)"
                                    : "' sends nothing") +
              ": set algo.compression = none");
  const bool all_reduces = algo.all_reduces(topology);
  require(all_reduces || compression != "topk", "algo.compression",
          "topk is for all-reduces (diloco, gasloc on the complete topology): in gossip an unsent coordinate would read as "
          "the peer's old value, a jump the size of the drift; use int8 or int4 (algo.gossip_codec = delta or modulo)");
  require(!all_reduces || algo.has_outer, "algo.compression",
          "'" + name.str() + "' on the complete topology has no anchor to compress its messages against; run diloco with "
          "algo.outer_lr = 1 and algo.outer_momentum = 0, which is the same round");
  require(all_reduces || gossip_codec != "direct" || compression == "int8", "algo.gossip_codec",
          "direct sends parameters whole, where int4's 15 levels lose everything but the largest; use modulo or delta with int4");
  require(wire_dtype == "fp32", "algo.wire_dtype",
          "algo.compression sets the message's encoding; leave algo.wire_dtype = fp32 with algo.compression = " + compression.str());
}

}  // namespace gasloc::algo

namespace gasloc::algo {

void AlgoConfig::validate_clip() const {
  using config::require;
  const AlgorithmEntry& algo = algorithm(name);
  // Checked even while clip_peers is off, so that a job file's bad factor is found before it is turned on.
  require(clip_factor > 1, "algo.clip_factor",
          "must be > 1: honest messages reach the median norm, and a threshold at or below it would clip half of them");
  if (!clip_peers) return;
  require(algo.sends_parameters, "algo.clip_peers",
          "clips the parameter messages of " + algorithm_names(&AlgorithmEntry::sends_parameters) + "; '" + name.str() +
              (algo.sends_gradients ? "' averages every step's gradients in an all-reduce, which is not clipped"
                                    : "' sends nothing") +
              ": set algo.clip_peers = false");
  const bool all_reduces = algo.all_reduces(topology);
  require(compression == "none" || !all_reduces, "algo.clip_peers",
          "a compressed all-reduce is not clipped (each owner sums shards of the messages and never sees a whole "
          "pseudo-gradient, whose norm clipping needs): set algo.clip_peers = false, algo.compression = none, or a "
          "gossip topology");
  require(!all_reduces || algo.has_outer, "algo.clip_peers",
          "an all-reduce is clipped on its pseudo-gradients theta - x, and '" + name.str() +
              "' on the complete topology has no anchor theta; run diloco with algo.outer_lr = 1 and "
              "algo.outer_momentum = 0, which is the same round");
}

}  // namespace gasloc::algo

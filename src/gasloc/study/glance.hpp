// "Claims at a glance": the top section of a results document, gathered from the study sections
// below it (`gasloc sweep --glance --doc FILE STUDY...`, run by scripts/experiments.sh after the
// studies): each study's title and unigram baseline, its verdict lines as its section states
// them, and the training time the sections report, summed. It reads the sections the sweep wrote
// (section.hpp), never the runs, so it needs no run directory and judges nothing itself.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "gasloc/study/study_file.hpp"

namespace gasloc::study {

// What the glance takes from one study section.
struct SectionDigest {
  bool found = false;
  std::string title;                  // its "## " heading, without " (quick mode)"
  std::string unigram;                // "Unigram baseline of the data: X" (the first), as written; "" if none
  std::vector<std::string> verdicts;  // the list items under "Claims:"
  int64_t runs = 0;                   // "Training time of these N runs: M min"
  double minutes = 0;
};
SectionDigest digest_section(const std::string& section);

// The glance section ("claims" or, with quick, "claims-quick") over these studies' sections in
// `doc_text`, in the order given; studies without a section are named as not run yet, and a
// section that another version of its study file wrote (section_version) is marked so. `command`
// is how it was invoked, `date` the day it is generated (YYYY-MM-DD).
std::string glance_section(const std::string& doc_text, const std::vector<SweepSpec>& studies, bool quick,
                           const std::string& command, const std::string& date);

// Writes the glance section into `doc` (write_doc_section: in place of the one there, else at the
// end), from the study sections `doc` holds. Throws ConfigError if `doc` does not exist.
void write_glance(const std::filesystem::path& doc, const std::vector<SweepSpec>& studies, bool quick,
                  const std::string& command);

}  // namespace gasloc::study

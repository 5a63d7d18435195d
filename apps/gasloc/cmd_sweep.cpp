// gasloc sweep FILE: runs a study's grid of training runs (resumable) and writes its report into
// the sweep's own directory, RUNS/NAME[-quick]/results.md (study/study_file.hpp has the file format).
// gasloc sweep --glance --doc DOC FILE...: "Claims at a glance" on top of DOC from those studies'
// sections in it (study/glance.hpp). gasloc sweep --reverdict --doc DOC FILE...: every claim of
// those studies judged again from their runs tables beside DOC (study/claims.hpp), then the glance.
#include <fmt/format.h>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/shipped_files.hpp"
#include "gasloc/study/claims.hpp"
#include "gasloc/study/glance.hpp"
#include "gasloc/study/study_file.hpp"
#include "gasloc/study/sweep.hpp"

namespace gasloc::app {

Action add_sweep(CLI::App& app) {
  struct Opts {
    std::vector<std::string> files;
    std::string doc, runs = "runs/experiments";
    bool quick = false, dry_run = false, print = false, glance = false, reverdict = false;
    std::vector<std::string> sets;
    int64_t steps = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("file", o->files, "sweep file (experiments/NAME.toml; a relative path missing from the working directory is "
                 "looked up in the installed share/gasloc); with --glance, every study of the suite")->required();
  app.add_flag("--quick", o->quick, "apply the file's [quick] settings (fewer steps); runs go to NAME-quick");
  app.add_flag("--dry-run", o->dry_run, "list the runs and whether each is finished, stopped or still to run");
  auto* doc = app.add_option("--doc", o->doc,
                             "markdown file whose section this sweep writes (default: RUNS/NAME/results.md, its own "
                             "directory; scripts/experiments.sh passes docs/results.md)");
  app.add_flag("--print", o->print, "print the section instead of writing it (plots still go to RUNS/NAME/results/)")
      ->excludes(doc);
  app.add_option("--runs", o->runs, "directory under which the sweep's runs live")->capture_default_str();
  auto* sets = app.add_option("--set", o->sets,
                              "a try, not the study: override a setting of every run, last (e.g. --set train.steps=50); "
                              "runs go to NAME-try, never into --doc");
  auto* steps = app.add_option("--steps", o->steps, "a try, not the study: every run takes this many steps (--set train.steps=N)")
                    ->check(CLI::PositiveNumber);
  sets->excludes(doc);
  steps->excludes(doc);
  app.add_flag("--glance", o->glance,
               "run nothing: write \"Claims at a glance\" into --doc from the sections the given studies wrote there "
               "(with --quick: their quick sections)")
      ->needs(doc);
  app.add_flag("--reverdict", o->reverdict,
               "run nothing: judge every claim of the given studies again from their runs tables (RESULTS/STUDY-runs.csv "
               "beside --doc, written by each study's sweep), rewrite their claim lines in --doc, then \"Claims at a glance\"")
      ->needs(doc);
  return [o]() {
    if (o->glance || o->reverdict) {
      std::vector<study::SweepSpec> studies;
      std::string names;
      for (const auto& f : o->files) {
        studies.push_back(study::load_sweep(find_shipped(f)));
        names += " " + f;
      }
      if (o->reverdict)
        for (const auto& spec : studies) fmt::print("{}\n", study::reverdict(o->doc, spec, o->quick));
      study::write_glance(o->doc, studies, o->quick,
                          fmt::format("gasloc sweep {}{} --doc {}{}", o->reverdict ? "--reverdict" : "--glance",
                                      o->quick ? " --quick" : "", o->doc, names));
      fmt::print("wrote the '{}' section of {}\n", o->quick ? "claims-quick" : "claims", o->doc);
      return 0;
    }
    if (o->files.size() != 1)
      throw ConfigError("gasloc sweep runs one study file at a time (several only with --glance or --reverdict)");
    auto spec = study::load_sweep(find_shipped(o->files.front()));
    // A try is a shortened or changed study: its own directory, and the section says so.
    std::string tried;
    if (o->steps > 0) o->sets.push_back(fmt::format("train.steps={}", o->steps));
    for (const auto& s : o->sets) {
      if (s.find('=') == std::string::npos) throw ConfigError(fmt::format("sweep --set '{}': expected section.key=value", s));
      spec.tried.push_back(s);
      tried += " --set " + s;
    }
    if (!tried.empty()) {
      spec.name += "-try";
      fmt::print("a try of the study, not the study:{} (runs in {}/{}{})\n", tried, o->runs, spec.name, o->quick ? "-quick" : "");
    }
    study::SweepOptions opts;
    opts.quick = o->quick;
    opts.dry_run = o->dry_run;
    opts.doc = o->doc;
    opts.print_only = o->print;
    opts.runs_root = o->runs;
    opts.command = fmt::format("gasloc sweep {}{}{}", o->files.front(), o->quick ? " --quick" : "", tried);
    std::error_code ec;
    opts.gasloc = std::filesystem::read_symlink("/proc/self/exe", ec);  // launched variants run this very build
    study::run_sweep(spec, opts);
    return 0;
  };
}

}  // namespace gasloc::app

// gasloc sweep FILE: runs a study's grid of training runs (resumable) and writes its report into
// the sweep's own directory, RUNS/NAME[-quick]/results.md (study/study_file.hpp has the file format).
#include <fmt/format.h>

#include "commands.hpp"
#include "gasloc/core/shipped_files.hpp"
#include "gasloc/study/study_file.hpp"
#include "gasloc/study/sweep.hpp"

namespace gasloc::app {

Action add_sweep(CLI::App& app) {
  struct Opts {
    std::string file, doc, runs = "runs/experiments";
    bool quick = false, dry_run = false, print = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("file", o->file, "sweep file (experiments/NAME.toml; a relative path missing from the working directory is "
                 "looked up in the installed share/gasloc)")->required();
  app.add_flag("--quick", o->quick, "apply the file's [quick] settings (fewer steps); runs go to NAME-quick");
  app.add_flag("--dry-run", o->dry_run, "list the runs and whether each is finished, stopped or still to run");
  auto* doc = app.add_option("--doc", o->doc,
                             "markdown file whose section this sweep writes (default: RUNS/NAME/results.md, its own "
                             "directory; scripts/experiments.sh passes docs/results.md)");
  app.add_flag("--print", o->print, "print the section instead of writing it (plots still go to RUNS/NAME/results/)")
      ->excludes(doc);
  app.add_option("--runs", o->runs, "directory under which the sweep's runs live")->capture_default_str();
  return [o]() {
    const auto spec = study::load_sweep(find_shipped(o->file));
    study::SweepOptions opts;
    opts.quick = o->quick;
    opts.dry_run = o->dry_run;
    opts.doc = o->doc;
    opts.print_only = o->print;
    opts.runs_root = o->runs;
    opts.command = fmt::format("gasloc sweep {}{}", o->file, o->quick ? " --quick" : "");
    std::error_code ec;
    opts.gasloc = std::filesystem::read_symlink("/proc/self/exe", ec);  // launched variants run this very build
    study::run_sweep(spec, opts);
    return 0;
  };
}

}  // namespace gasloc::app

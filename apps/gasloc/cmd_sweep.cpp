// gasloc sweep FILE: runs a study's grid of training runs (resumable) and writes its section of
// docs/results.md (train/sweep.hpp has the file format).
#include <fmt/format.h>

#include "commands.hpp"
#include "gasloc/train/sweep.hpp"

namespace gasloc::app {

Action add_sweep(CLI::App& app) {
  struct Opts {
    std::string file, doc = "docs/results.md", runs = "runs/experiments";
    bool quick = false, dry_run = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("file", o->file, "sweep file (experiments/NAME.toml)")->required();
  app.add_flag("--quick", o->quick, "apply the file's [quick] settings (fewer steps); runs go to NAME-quick");
  app.add_flag("--dry-run", o->dry_run, "list the runs and whether each is finished, stopped or still to run");
  app.add_option("--doc", o->doc, "markdown file whose section this sweep writes (\"\" = print it)")->capture_default_str();
  app.add_option("--runs", o->runs, "directory under which the sweep's runs live")->capture_default_str();
  return [o]() {
    const auto spec = train::load_sweep(o->file);
    train::SweepOptions opts;
    opts.quick = o->quick;
    opts.dry_run = o->dry_run;
    opts.doc = o->doc;
    opts.runs_root = o->runs;
    opts.command = fmt::format("gasloc sweep {}{}", o->file, o->quick ? " --quick" : "");
    train::run_sweep(spec, opts);
    return 0;
  };
}

}  // namespace gasloc::app

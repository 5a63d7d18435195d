// Subcommands of the `gasloc` binary. Each file cmd_*.cpp defines one add_* function that
// declares its options on a CLI11 subcommand and returns the action to run when it is chosen.
// Actions throw gasloc::Error on bad input; main() prints it and sets the exit code.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace gasloc::app {

using Action = std::function<int()>;

Action add_prepare(CLI::App& app);
Action add_train(CLI::App& app);
Action add_model_info(CLI::App& app);
Action add_export(CLI::App& app);
Action add_eval(CLI::App& app);
Action add_generate(CLI::App& app);
Action add_report(CLI::App& app);
Action add_dashboard(CLI::App& app);
Action add_launch(CLI::App& app);
Action add_comm_check(CLI::App& app);
Action add_store(CLI::App& app);
Action add_topo(CLI::App& app);
Action add_sweep(CLI::App& app);
Action add_secret(CLI::App& app);

}  // namespace gasloc::app

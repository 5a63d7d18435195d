// gasloc dashboard: a live view of runs in a browser. A small HTTP server (http_server.hpp) on
// loopback serves the page (study/dashboard.hpp) and, at /data.json, what the page polls: every
// run's metrics so far, re-read incrementally from its metrics.jsonl at each poll. Reach it from
// another machine through an ssh tunnel (docs/training.md, "Watching a run").
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <filesystem>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"
#include "gasloc/study/dashboard.hpp"
#include "gasloc/study/run_summary.hpp"
#include "http_server.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

namespace {

struct DashboardOptions {
  std::vector<std::string> runs;
  std::string addr = "127.0.0.1";
  std::vector<std::string> allowed_hosts;
  int port = 8080;
  double refresh_s = 3;
};

void add_dashboard_options(CLI::App& app, DashboardOptions& o) {
  app.add_option("--run,runs", o.runs, "run directories to follow (they may still be training, or not started yet)")
      ->required();
  app.add_option("--port", o.port, "port to serve on; 0: a free one (the URL is printed)")->capture_default_str();
  app.add_option("--addr", o.addr,
                 "IPv4 address to listen on; anything but loopback lets other hosts read the runs' metrics "
                 "(an ssh tunnel is safer: docs/training.md)")
      ->capture_default_str();
  app.add_option("--allow-host", o.allowed_hosts,
                 "another name the page may be opened under (as in the browser's address), besides 127.0.0.1, "
                 "localhost, [::1] and --addr; requests for any other Host are refused (DNS rebinding)");
  app.add_option("--refresh", o.refresh_s, "seconds between the page's updates")
      ->check(CLI::Range(0.2, 3600.0))
      ->capture_default_str();
}

// Ctrl+C and SIGTERM stop serving (HttpServer::serve polls the flag); the previous handlers come
// back when this goes out of scope.
class StopOnSignal {
 public:
  StopOnSignal() {
    struct sigaction sa {};
    sa.sa_handler = [](int) { request_interrupt(); };
    sigemptyset(&sa.sa_mask);  // no SA_RESTART: poll() returns at once
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopOnSignal() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

std::vector<study::RunWatch> watch_runs(const std::vector<std::string>& dirs) {
  const std::vector<std::string> names = study::run_labels(dirs);
  std::vector<study::RunWatch> runs;
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::error_code ec;
    if (fs::exists(dirs[i], ec) && !fs::is_directory(dirs[i], ec))
      throw Error(fmt::format("'{}' is not a directory", dirs[i]), "give gasloc dashboard run directories (train.run_dir)");
    if (!fs::exists(dirs[i], ec))
      fmt::print("note: '{}' does not exist yet: the page shows it once its training starts\n", dirs[i]);
    runs.emplace_back(dirs[i], names[i]);
  }
  return runs;
}

int run_dashboard(const DashboardOptions& o) {
  study::require_dashboard_assets();
  std::vector<study::RunWatch> runs = watch_runs(o.runs);
  study::DashboardPage page;
  page.title = "gasloc dashboard: " + fmt::format("{}", fmt::join(study::run_labels(o.runs), ", "));
  page.data_url = "data.json";
  page.refresh_s = o.refresh_s;
  const std::string html = study::dashboard_html(page);

  HttpServer server(o.addr, o.port, o.allowed_hosts);
  if (!is_loopback(o.addr))
    fmt::print(stderr, "warning: listening on {}: any host that reaches it can read these runs' metrics; "
               "an ssh tunnel to the default 127.0.0.1 keeps it private (docs/training.md)\n", o.addr);
  fmt::print("dashboard: http://{}:{}/ following {} run{} (Ctrl+C stops)\n", o.addr, server.port(), runs.size(),
             runs.size() == 1 ? "" : "s");
  StopOnSignal stop_on_signal;
  clear_interrupt();
  server.serve([&](const std::string& target) -> HttpResponse {
    const std::string path = target.substr(0, target.find('?'));
    if (path == "/" || path == "/index.html") return {200, "text/html; charset=utf-8", html};
    if (path == "/data.json") return {200, "application/json", study::json_text(study::dashboard_json(runs))};
    return {404, "text/plain; charset=utf-8", "not found: the page is /, its data /data.json\n"};
  });
  fmt::print("dashboard: stopped\n");
  return 0;
}

}  // namespace

Action add_dashboard(CLI::App& app) {
  auto o = std::make_shared<DashboardOptions>();
  add_dashboard_options(app, *o);
  return [o]() { return run_dashboard(*o); };
}

}  // namespace gasloc::app

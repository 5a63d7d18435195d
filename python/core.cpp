// gasloc._core: the compiled half of the Python package (python/gasloc/__init__.py is the other).
// A thin binding of train::UserRun (src/gasloc/train/user_run.hpp): the job, the cluster and the
// run live in C++; tensors cross zero-copy as at::Tensor. gasloc's errors become Python's: a bad
// setting is a ValueError naming the key, any other gasloc error a RuntimeError; both carry the
// hint that says what to do.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gasloc/core/error.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/user_run.hpp"
#include "parts.hpp"

namespace py = pybind11;
using namespace gasloc;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The job as a launcher started this process: one rank of WORLD_SIZE when it is set, and under
// gasloc launch --secret-file the job's secret (GASLOC_SECRET_FILE) unless the settings name one.
// The incarnation of an elastic rank (GASLOC_INCARNATION): 0 founds the job, more joins it; -1
// (unset) asks a gasloc store --elastic, as a gasloc train rank started by hand does.
int64_t incarnation() {
  const std::string inc = env("GASLOC_INCARNATION");
  return inc.empty() ? -1 : std::stoll(inc);
}

// Under gasloc launch --elastic (GASLOC_ELASTIC), cluster.elastic.
train::JobConfig launched_job(const std::string& config, std::vector<std::string> overrides) {
  if (!env("GASLOC_ELASTIC").empty()) overrides.push_back("cluster.elastic=true");
  train::JobConfig job = train::user_job(config, overrides, !env("WORLD_SIZE").empty());
  if (job.cluster.secret_file.empty()) job.cluster.secret_file = env("GASLOC_SECRET_FILE");
  return job;
}

// The cluster this process hosts and the run on its rank, made and let go together.
class PyRun {
 public:
  PyRun(const std::string& config, const std::vector<std::string>& overrides,
        const std::vector<std::pair<std::string, at::Tensor>>& params, const std::string& optimizer,
        std::optional<int64_t> resume)
      : job_(launched_job(config, overrides)),
        cluster_(train::open_user_cluster(job_, env("GASLOC_JOB_ID"), incarnation())),
        run_(std::make_unique<train::UserRun>(job_, params, *cluster_, cluster_->local_ranks().front(), optimizer,
                                              resume)) {}
  train::UserRun& run() { return *run_; }

 private:
  train::JobConfig job_;
  std::unique_ptr<comm::Cluster> cluster_;
  std::unique_ptr<train::UserRun> run_;
};

// The user's share of a checkpoint crosses as named tensors and a JSON text (the package packs it).
using UserTensors = std::map<std::string, at::Tensor>;

void checkpoint(PyRun& r, const UserTensors& tensors, const std::string& json) {
  r.run().checkpoint(train::UserState{tensors, nlohmann::json::parse(json)});
}

void heal(PyRun& r, const UserTensors& tensors, const std::string& json) {
  r.run().heal(train::UserState{tensors, nlohmann::json::parse(json)});
}

void leave(PyRun& r, const UserTensors& tensors, const std::string& json) {
  r.run().leave(train::UserState{tensors, nlohmann::json::parse(json)});
}

std::optional<std::pair<UserTensors, std::string>> resumed(PyRun& r) {
  const auto& user = r.run().resumed();
  if (!user) return std::nullopt;
  return std::make_pair(user->tensors, user->json.dump());
}

std::string with_hint(const Error& e) { return e.hint().empty() ? e.what() : std::string(e.what()) + " (" + e.hint() + ")"; }

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "gasloc's runtime for a model, data and inner optimizer of the user's (see the gasloc package)";
  // The torch this module was built against: the interpreter's at configure time, and LibTorch's headers.
  m.attr("TORCH_VERSION") = GASLOC_PYTHON_TORCH_VERSION;
  m.attr("LIBTORCH_VERSION") = TORCH_VERSION;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      PyErr_SetString(PyExc_ValueError, with_hint(e).c_str());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, with_hint(e).c_str());
    }
  });
  bind_parts(m);  // gasloc.models, gasloc.optim, gasloc.data (parts.cpp)
  m.def("describe_settings", &train::describe_job, "every key of the job file, its type, default and doc");
  m.def("refusal", &train::user_key_refusal, py::arg("key"),
        "why a key cannot be set for a Python run ('' when it can)");
  // The GIL is released while the runtime joins the cluster and communicates.
  py::class_<PyRun>(m, "Run")
      .def(py::init<const std::string&, const std::vector<std::string>&,
                    const std::vector<std::pair<std::string, at::Tensor>>&, const std::string&, std::optional<int64_t>>(),
           py::arg("config"), py::arg("overrides"), py::arg("params"), py::arg("optimizer"), py::arg("resume"),
           py::call_guard<py::gil_scoped_release>())
      .def("step", [](PyRun& r, std::optional<double> loss, double lr) { return r.run().step(loss, lr); }, py::arg("loss"),
           py::arg("lr"), py::call_guard<py::gil_scoped_release>())
      .def("should_compute", [](PyRun& r) { return r.run().should_compute(); }, py::call_guard<py::gil_scoped_release>())
      .def("sync_gradients", [](PyRun& r) { return r.run().sync_gradients(); }, py::call_guard<py::gil_scoped_release>())
      .def("eval_due", [](PyRun& r) { return r.run().eval_due(); })
      .def("begin_evaluation", [](PyRun& r) { return r.run().begin_evaluation(); }, py::call_guard<py::gil_scoped_release>())
      .def("end_evaluation", [](PyRun& r, double own, std::optional<double> average) { r.run().end_evaluation(own, average); },
           py::arg("own"), py::arg("average"), py::call_guard<py::gil_scoped_release>())
      .def("checkpoint_due", [](PyRun& r) { return r.run().checkpoint_due(); })
      .def("checkpoint", &checkpoint, py::arg("tensors"), py::arg("json"), py::call_guard<py::gil_scoped_release>())
      .def("resumed", &resumed)
      .def("heal_due", [](PyRun& r) { return r.run().heal_due(); })
      .def("heal", &heal, py::arg("tensors"), py::arg("json"), py::call_guard<py::gil_scoped_release>())
      .def("leave", &leave, py::arg("tensors"), py::arg("json"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("elastic", [](PyRun& r) { return r.run().elastic(); })
      .def("stop_agreed", [](PyRun& r) { return r.run().stop_agreed(); })
      .def("land", [](PyRun& r) { return r.run().land(); }, py::call_guard<py::gil_scoped_release>())
      .def("close", [](PyRun& r) { r.run().close(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("evaluated_step", [](PyRun& r) { return r.run().evaluated_step(); })
      .def_property_readonly("checkpointed_step", [](PyRun& r) { return r.run().checkpointed_step(); })
      .def_property_readonly("rank", [](PyRun& r) { return r.run().rank(); })
      .def_property_readonly("world", [](PyRun& r) { return r.run().world(); })
      .def_property_readonly("steps_done", [](PyRun& r) { return r.run().steps_done(); })
      .def_property_readonly("run_dir", [](PyRun& r) { return r.run().run_dir().string(); })
      .def_property_readonly("user_run", [](PyRun& r) { return &r.run(); }, py::return_value_policy::reference_internal);
}

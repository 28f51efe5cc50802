// mend._mend: the Python extension under the `mend` package (python/mend/).
// It binds the configuration key table, an embedded lighthouse, the status
// call, and a learner runtime (LearnerAgent + Reducer over the model's own
// parameter tensors); the package's Python code builds MendConfig,
// mend_init and mend_shutdown on it.
//
// Threads: every blocking call releases the GIL. A Reducer::step that may
// wait for a round runs on a helper thread so that the caller can look for
// signals (Ctrl-C) while it waits; no mend thread touches a Python object.
// Errors: a non-OK Status raises the exception class registered for its code
// (subclasses of mend.MendError), with the C++ message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "mend/config.h"
#include "mend/group_store.h"
#include "mend/inner_moments.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse.h"
#include "mend/lighthouse_client.h"
#include "mend/logging.h"
#include "mend/reducer.h"
#include "mend/status.h"
#include "core/status_format.h"

extern char** environ;

namespace py = pybind11;

namespace mend::python {
namespace {

// mend.MendError and one subclass per status code, created at import.
std::map<int, py::object>& ErrorClasses() {
  static auto* classes = new std::map<int, py::object>();
  return *classes;
}

[[noreturn]] void Raise(const Status& status) {
  auto& classes = ErrorClasses();
  auto it = classes.find(static_cast<int>(status.code()));
  py::object type = it != classes.end() ? it->second : classes.at(-1);
  PyErr_SetString(type.ptr(), std::string(status.message()).c_str());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Take(StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(*value);
}

// The process that created an object; a fork (a DataLoader worker) gets a
// clear error instead of threads and sockets that are not there.
void CheckSameProcess(pid_t owner, const char* what) {
  if (getpid() != owner) {
    Raise(FailedPreconditionError(fmt::format(
        "{} was created in process {}; it cannot be used in the forked process {} (a DataLoader "
        "worker?): mend calls belong in the training process",
        what, owner, getpid())));
  }
}

// Config from (key, text) pairs: defaults < file < MEND_* environment <
// keywords, then the cross-key checks. An unknown key raises TypeError
// naming the closest known key, a bad value ValueError.
Config LoadConfig(const std::vector<std::pair<std::string, std::string>>& keywords,
                  const std::string& file, bool use_environment) {
  for (const auto& [key, text] : keywords) {
    if (FindConfigKey(key) == nullptr) {
      std::string suggestion = SuggestConfigKey(key);
      throw py::type_error(
          fmt::format("MendConfig() got an unexpected keyword argument '{}'{}", key,
                      suggestion.empty() ? "" : fmt::format("; did you mean '{}'?", suggestion)));
    }
  }
  ConfigSources sources;
  sources.file = file;
  sources.environ = use_environment ? environ : nullptr;
  for (const auto& [key, text] : keywords)
    sources.overrides.push_back({key, text, "keyword " + key});
  StatusOr<Config> config = mend::LoadConfig(sources);
  if (!config.ok()) {
    if (config.status().code() == StatusCode::kInvalidArgument) {
      throw py::value_error(std::string(config.status().message()));
    }
    Raise(config.status());
  }
  return *config;
}

py::list KeyTable() {
  py::list keys;
  Config defaults;
  for (const ConfigKey& key : ConfigKeys()) {
    py::dict row;
    row["name"] = std::string(key.name);
    static const char* kTypes[] = {"int", "float", "bool", "str", "enum"};
    row["type"] = kTypes[static_cast<int>(key.type)];
    row["default"] = FormatConfigValue(defaults, key);
    row["help"] = std::string(key.help);
    if (key.type == ConfigType::kInt || key.type == ConfigType::kDouble) {
      row["min"] = key.min;
      row["max"] = key.max;
    }
    py::list choices;
    for (auto choice : key.choices) choices.append(std::string(choice));
    row["choices"] = choices;
    keys.append(row);
  }
  return keys;
}

py::dict ConfigValues(const Config& config) {
  py::dict values;
  for (const ConfigKey& key : ConfigKeys())
    values[py::str(std::string(key.name))] = FormatConfigValue(config, key);
  return values;
}

// Runs `work` with the GIL released (the error, if any, is raised after it
// is taken back: Python's error state needs the GIL).
template <typename Work>
auto Unlocked(Work&& work) -> decltype(work()) {
  py::gil_scoped_release release;
  return work();
}

StatusOr<std::string> FetchStatus(const std::string& address, const std::string& token,
                                  uint32_t max_learners, uint32_t max_rounds,
                                  const std::string& ca_file) {
  return Unlocked([&]() -> StatusOr<std::string> {
    MEND_ASSIGN_OR_RETURN(
        auto client, LighthouseClient::Connect({address, token, ca_file, 5 * kMicrosPerSecond}));
    return client->StatusJson(max_learners, max_rounds);
  });
}

class PyLighthouse {
 public:
  PyLighthouse(const Config& config, const std::string& token) : token_(token) {
    Check(InitLogging(config.log_level, "lighthouse"));
    server_ = Take(Unlocked([&]() { return LighthouseServer::Start(config, token); }));
  }
  std::string address() const { return server_ ? server_->grpc_address() : ""; }
  std::string http_address() const { return server_ ? server_->http_address() : ""; }
  std::string status_json(uint32_t max_learners, uint32_t max_rounds) {
    return Take(FetchStatus(address(), token_, max_learners, max_rounds, ""));
  }
  void shutdown() {
    py::gil_scoped_release release;
    if (server_) server_->Shutdown();
    server_.reset();
  }

 private:
  std::unique_ptr<LighthouseServer> server_;
  std::string token_;
};

std::string StatusJson(const std::string& address, const std::string& token, uint32_t max_learners,
                       uint32_t max_rounds, const std::string& ca_file) {
  return Take(FetchStatus(address, token, max_learners, max_rounds, ca_file));
}

// One learner: its agent and the reducer over the caller's tensors.
class PyRuntime {
 public:
  PyRuntime(const Config& config, const std::string& token, const std::string& learner_id,
            std::vector<std::pair<std::string, at::Tensor>> parameters, uint64_t start_step)
      : owner_(getpid()) {
    for (size_t i = 0; i < parameters.size(); ++i) numels_.push_back(parameters[i].second.numel());
    Check(InitLogging(config.log_level, learner_id));
    auto moments = std::make_unique<TensorMoments>(parameters.size());
    moments_ = moments.get();
    Status started = Unlocked([&]() -> Status {
      MEND_ASSIGN_OR_RETURN(GroupStoreOpener group_store, GroupStoreFromConfig(config));
      MEND_ASSIGN_OR_RETURN(agent_, LearnerAgent::Start(config, token, {learner_id, config.job_id, config.rack, ""},
                                                        std::move(group_store)));
      auto reducer = Reducer::Create(config, NamedParameters(std::move(parameters)),
                                     std::move(moments), *agent_, start_step);
      if (!reducer.ok()) {
        (void)agent_->Leave("the reducer could not start");
        return reducer.status();
      }
      reducer_ = std::move(*reducer);
      return OkStatus();
    });
    Check(started);
  }

  ~PyRuntime() {
    if (getpid() != owner_) {  // a forked child: its copies of the threads do not exist
      (void)agent_.release();
      (void)reducer_.release();
      return;
    }
    py::gil_scoped_release release;
    if (reducer_) (void)reducer_->shutdown();
  }

  // Hands over parameter `index`'s Adam moments (optimizer.state[p]).
  void set_moments(size_t index, at::Tensor first, at::Tensor second) {
    CheckSameProcess(owner_, "this mend runtime");
    if (index >= numels_.size()) Raise(InvalidArgumentError(fmt::format("no parameter {}", index)));
    Check(moments_->Set(index, std::move(first), std::move(second), numels_[index]));
  }

  // Reducer::step with the GIL released; KeyboardInterrupt (or another
  // signal handler's exception) while it waits calls the round off and
  // leaves the job.
  void step(uint64_t tokens) {
    CheckSameProcess(owner_, "this mend runtime");
    if (!reducer_) Raise(FailedPreconditionError("mend: step() after shutdown()"));
    if (!reducer_->NextStepMayWait()) {  // most steps: bookkeeping only, on this thread
      Check(Unlocked([&]() { return reducer_->step(tokens); }));
      return;
    }
    // A step that may wait for a round runs on a helper thread while this
    // one looks for signals every 20 ms.
    std::future<Status> done;
    {
      py::gil_scoped_release release;
      done = std::async(std::launch::async, [this, tokens]() { return reducer_->step(tokens); });
      while (done.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
        py::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) {
          py::error_already_set interrupted;
          {
            py::gil_scoped_release again;
            agent_->Interrupt();
            (void)done.get();
            (void)reducer_->shutdown();
          }
          reducer_.reset();
          throw interrupted;
        }
      }
    }
    Check(done.get());
  }

  py::dict stats() const {
    static constexpr std::pair<const char*, uint64_t ReducerStats::*> kFields[] = {
        {"steps", &ReducerStats::steps},
        {"rounds_started", &ReducerStats::rounds_started},
        {"rounds", &ReducerStats::rounds},
        {"failed_rounds", &ReducerStats::failed_rounds},
        {"passed_over", &ReducerStats::passed_over},
        {"heals", &ReducerStats::heals},
        {"moment_syncs", &ReducerStats::moment_syncs},
        {"bytes_sent", &ReducerStats::bytes_sent},
        {"cross_rack_bytes_sent", &ReducerStats::cross_rack_bytes_sent},
        {"last_round_id", &ReducerStats::last_round_id},
        {"checkpoints", &ReducerStats::checkpoints},
        {"checkpoint_failures", &ReducerStats::checkpoint_failures},
        {"resumed_from_round", &ReducerStats::resumed_from_round},
        {"overlap_steps", &ReducerStats::overlap_steps},
        {"parameter_copies", &ReducerStats::parameter_copies}};
    py::dict out;
    if (!reducer_) return out;
    const ReducerStats stats = reducer_->stats();
    for (const auto& [name, field] : kFields) out[name] = stats.*field;
    return out;
  }

  // The global parameters of fragment `f` as of the last round, as a copy.
  std::vector<float> global_state(int fragment) const {
    if (!reducer_ || fragment < 0 || fragment >= reducer_->fragments()) return {};
    auto span = reducer_->global(fragment);
    return {span.begin(), span.end()};
  }
  int fragments() const { return reducer_ ? reducer_->fragments() : 0; }

  void save_checkpoint(const std::string& path) {
    CheckSameProcess(owner_, "this mend runtime");
    if (!reducer_) Raise(FailedPreconditionError("mend: save_checkpoint() after shutdown()"));
    Check(Unlocked([&]() { return reducer_->SaveCheckpoint(path); }));
  }

  void shutdown() {
    CheckSameProcess(owner_, "this mend runtime");
    if (!reducer_) return;
    Check(Unlocked([&]() {
      Status status = reducer_->shutdown();
      reducer_.reset();
      return status;
    }));
  }
  bool closed() const { return reducer_ == nullptr; }

 private:
  const pid_t owner_;
  std::vector<int64_t> numels_;
  TensorMoments* moments_ = nullptr;  // owned by reducer_
  std::unique_ptr<LearnerAgent> agent_;
  std::unique_ptr<Reducer> reducer_;
};

void RegisterErrors(py::module_& m) {
  py::object base = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "mend.MendError", "Base of every error mend raises; .args[0] is the message.",
      PyExc_RuntimeError, nullptr));
  m.attr("MendError") = base;
  ErrorClasses()[-1] = base;
  const std::pair<StatusCode, const char*> codes[] = {
      {StatusCode::kCancelled, "CancelledError"},
      {StatusCode::kUnknown, "UnknownError"},
      {StatusCode::kInvalidArgument, "InvalidArgumentError"},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError"},
      {StatusCode::kNotFound, "NotFoundError"},
      {StatusCode::kAlreadyExists, "AlreadyExistsError"},
      {StatusCode::kPermissionDenied, "PermissionDeniedError"},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError"},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError"},
      {StatusCode::kAborted, "AbortedError"},
      {StatusCode::kOutOfRange, "OutOfRangeError"},
      {StatusCode::kUnimplemented, "UnimplementedError"},
      {StatusCode::kInternal, "InternalError"},
      {StatusCode::kUnavailable, "UnavailableError"},
      {StatusCode::kDataLoss, "DataLossError"},
      {StatusCode::kUnauthenticated, "UnauthenticatedError"},
  };
  for (const auto& [code, name] : codes) {
    py::object type = py::reinterpret_steal<py::object>(
        PyErr_NewException(fmt::format("mend.{}", name).c_str(), base.ptr(), nullptr));
    m.attr(name) = type;
    ErrorClasses()[static_cast<int>(code)] = type;
  }
}

}  // namespace

PYBIND11_MODULE(_mend, m) {
  m.doc() = "mend's C++ core (use the mend package, not this module)";
  RegisterErrors(m);
  m.attr("TORCH_VERSION") = MEND_TORCH_VERSION;
  m.def("config_keys", &KeyTable, "The configuration key table, one dict per key.");

  py::class_<Config>(m, "Config")
      .def(py::init(&LoadConfig), py::arg("keywords"), py::arg("file") = "",
           py::arg("use_environment") = true)
      .def("values", &ConfigValues, "Every key's value as the text the CLI would accept.")
      .def("to_toml", [](const Config& c) { return ConfigToToml(c); });
  m.def(
      "read_job_token", [](const Config& config) { return Take(ReadJobToken(config, environ)); },
      "MEND_JOB_TOKEN, else the contents of token_file.");

  py::class_<PyLighthouse>(m, "Lighthouse")
      .def(py::init<const Config&, const std::string&>())
      .def_property_readonly("address", &PyLighthouse::address)
      .def_property_readonly("http_address", &PyLighthouse::http_address)
      .def("status_json", &PyLighthouse::status_json, py::arg("max_learners") = 0,
           py::arg("max_rounds") = 0)
      .def("shutdown", &PyLighthouse::shutdown);
  m.def("status_json", &StatusJson, py::arg("address"), py::arg("token"),
        py::arg("max_learners") = 0, py::arg("max_rounds") = 0, py::arg("ca_file") = "");

  py::class_<PyRuntime>(m, "Runtime")
      .def(py::init<const Config&, const std::string&, const std::string&,
                    std::vector<std::pair<std::string, at::Tensor>>, uint64_t>(),
           py::arg("config"), py::arg("token"), py::arg("learner_id"), py::arg("parameters"),
           py::arg("start_step") = 0)
      .def("set_moments", &PyRuntime::set_moments)
      .def("step", &PyRuntime::step, py::arg("tokens"))
      .def("stats", &PyRuntime::stats)
      .def("global_state", &PyRuntime::global_state, py::arg("fragment") = 0)
      .def_property_readonly("fragments", &PyRuntime::fragments)
      .def("save_checkpoint", &PyRuntime::save_checkpoint)
      .def("shutdown", &PyRuntime::shutdown)
      .def_property_readonly("closed", &PyRuntime::closed);
}

}  // namespace mend::python

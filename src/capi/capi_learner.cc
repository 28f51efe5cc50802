// The C ABI's learner: a LearnerAgent and a round driver over caller-owned
// buffers. A step that may wait for a round runs on a helper thread, so
// that the caller can return to look for signals (MEND_PENDING) between
// waits; every other call runs on the caller's thread.
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "capi/capi_common.h"
#include "capi/raw_buffers.h"
#include "core/job_token.h"
#include "fmt/format.h"
#include "mend/communicator.h"
#include "mend/learner_agent.h"
#include "mend/logging.h"
#include "mend/outer.h"
#include "reducer/learner_session.h"
#include "reducer/options_from_config.h"
#include "reducer/round_driver.h"
#include "spdlog/spdlog.h"

struct mend_learner {
  pid_t owner = 0;
  std::unique_ptr<mend::reducer::LearnerSession> session;
  std::unique_ptr<mend::reducer::RoundDriver> driver;  // (on session)
  mend::capi::RawParameters* parameters = nullptr;     // owned by driver
  mend::capi::RawMoments* moments =
      nullptr;  // owned by driver; null without desloc or heal_inner_optimizer
  mend::capi::RawParameters* buffers[2] = {};  // owned by driver; the model's buffers, by kind
  std::future<mend::Status> pending;           // a step waiting on the helper thread
  uint64_t writes_before = 0;                  // the buffers' writes when the last call began
  uint32_t last_flags = 0;
  // By fragment: the next step's plan (empty: none fixed), and what the
  // last call read and wrote of the parameters (MEND_FRAGMENTS_*).
  std::vector<uint8_t> planned;
  uint32_t planned_flags = 0;  // the plan's MEND_STEP_* (when `planned` is not empty)
  std::vector<uint8_t> touched[2];
  bool shut_down = false;
};

using mend::capi::Fail;
using mend::capi::Guarded;
using mend::capi::NullArgument;
using mend::capi::Return;

namespace {

uint64_t Writes(const mend_learner& learner) {
  uint64_t writes =
      learner.parameters->writes() + (learner.moments != nullptr ? learner.moments->writes() : 0);
  for (const mend::capi::RawParameters* buffers : learner.buffers)
    writes += buffers != nullptr ? buffers->writes() : 0;
  return writes;
}

// The learner's state allows a call: it exists, belongs to this process and
// no step is pending.
mend::Status Usable(const mend_learner* learner, std::string_view function) {
  if (learner == nullptr)
    return mend::InvalidArgumentError(fmt::format("{}: learner is NULL", function));
  if (getpid() != learner->owner) {
    return mend::FailedPreconditionError(
        fmt::format("{}: this mend learner was created in process {}; it cannot be used in the "
                    "forked process {} (a "
                    "DataLoader worker?): mend calls belong in the training process",
                    function, learner->owner, getpid()));
  }
  if (learner->pending.valid()) {
    return mend::FailedPreconditionError(fmt::format(
        "{}: a step is still waiting for its round; call mend_learner_wait until it is done",
        function));
  }
  return mend::OkStatus();
}

void BeginCall(mend_learner& learner) {
  learner.writes_before = Writes(learner);
  learner.parameters->ClearTouched();
}

// The fragment buffer i belongs to (FragmentOfLayer: i mod fragments).
size_t FragmentOf(const mend_learner& learner, size_t i) {
  return static_cast<size_t>(mend::FragmentOfLayer(
      static_cast<int64_t>(learner.parameters->layer(i)), learner.driver->fragments()));
}

// What the call read and wrote, by fragment; a step that touched a fragment
// its plan left out is a defect of the plan (a front end that stages by
// fragment would have had a stale copy there): said loudly.
void RecordTouched(mend_learner& learner) {
  const int fragments = learner.driver->fragments();
  for (auto& touched : learner.touched) touched.assign(static_cast<size_t>(fragments), 0);
  const mend::capi::RawParameters& parameters = *learner.parameters;
  for (size_t i = 0; i < parameters.count(); ++i) {
    const size_t f = FragmentOf(learner, i);
    const uint8_t how = parameters.touched(i);
    learner.touched[0][f] |= (how & mend::capi::RawParameters::kRead) != 0 ? 1 : 0;
    learner.touched[1][f] |= (how & mend::capi::RawParameters::kWritten) != 0 ? 1 : 0;
  }
  if (learner.planned.empty()) return;
  if ((learner.planned_flags & MEND_STEP_MAY_WRITE) == 0 &&
      Writes(learner) != learner.writes_before) {
    spdlog::error(
        "mend: step {} wrote the parameters, which its plan said it would only read: a front end "
        "that made the step later had them overwritten (a defect of mend's; please report it)",
        learner.driver->stats().steps);
  }
  for (size_t f = 0; f < learner.planned.size(); ++f) {
    if (learner.planned[f] == 0 && (learner.touched[0][f] | learner.touched[1][f]) != 0) {
      spdlog::error(
          "mend: step {} touched the parameters of fragment {}, which its plan left out: a "
          "front end that stages by fragment copied them stale (a defect of mend's; please "
          "report it)",
          learner.driver->stats().steps, f);
    }
  }
  learner.planned.clear();
}

void EndCall(mend_learner& learner) {
  learner.last_flags = Writes(learner) != learner.writes_before ? MEND_STEP_WROTE : 0;
  RecordTouched(learner);
}

mend::StatusOr<std::vector<mend::capi::RawBuffer>> Buffers(
    const mend_buffer* parameters, size_t count,
    std::string_view function = "mend_learner_create") {
  if (count == 0)
    return mend::InvalidArgumentError(fmt::format("{}: no buffers (count is 0)", function));
  if (parameters == nullptr)
    return mend::InvalidArgumentError(fmt::format("{}: the buffers are NULL", function));
  std::vector<mend::capi::RawBuffer> buffers;
  std::set<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    const mend_buffer& p = parameters[i];
    if (p.name == nullptr || *p.name == '\0') {
      return mend::InvalidArgumentError(fmt::format("{}: buffer {} has no name", function, i));
    }
    if (!names.insert(p.name).second) {
      return mend::InvalidArgumentError(
          fmt::format("{}: two buffers are named '{}'", function, p.name));
    }
    if (p.data == nullptr && p.numel > 0) {
      return mend::InvalidArgumentError(
          fmt::format("{}: buffer '{}' has no data", function, p.name));
    }
    mend::capi::RawBuffer buffer{p.name, p.data, static_cast<size_t>(p.numel), {}};
    if (p.shape == nullptr || p.ndim == 0) {
      buffer.shape = {static_cast<int64_t>(p.numel)};
    } else {
      buffer.shape.assign(p.shape, p.shape + p.ndim);
      int64_t product = 1;
      for (int64_t size : buffer.shape) product *= size;
      if (product != static_cast<int64_t>(p.numel)) {
        return mend::InvalidArgumentError(
            fmt::format("{}: buffer '{}' has {} values but its shape holds {}", function, p.name,
                        p.numel, product));
      }
    }
    buffers.push_back(std::move(buffer));
  }
  return buffers;
}

// The learner's session and round driver over `buffers`; `job_settings`
// beside the config's shared ones.
mend::Status Create(const mend::Config& unchecked, const std::vector<std::string>& job_settings,
                    const char* token, const char* learner_id,
                    std::vector<mend::capi::RawBuffer> buffers, uint64_t start_step,
                    mend_learner& learner) {
  // Checked here once: the session, its agent and the round driver take it as it is.
  MEND_ASSIGN_OR_RETURN(const mend::ValidConfig config, mend::ValidConfig::Check(unchecked));
  MEND_RETURN_IF_ERROR(mend::InitLogging(config->log_level, learner_id));
  std::vector<size_t> numels;
  for (const auto& buffer : buffers) numels.push_back(buffer.numel);
  auto parameters = std::make_unique<mend::capi::RawParameters>(std::move(buffers));
  std::unique_ptr<mend::capi::RawMoments> moments;
  if (config->desloc || config->heal_inner_optimizer)
    moments = std::make_unique<mend::capi::RawMoments>(numels);
  learner.parameters = parameters.get();
  learner.moments = moments.get();
  mend::reducer::LearnerSessionOptions options{
      learner_id, token, mend::RealClock(), {}, job_settings};
  for (size_t i = 0; i < parameters->count(); ++i)
    options.parameter_shapes.push_back(parameters->shape(i));
  MEND_ASSIGN_OR_RETURN(learner.session,
                        mend::reducer::StartLearnerSession(config, std::move(options)));
  MEND_ASSIGN_OR_RETURN(learner.driver, learner.session->CreateDriver(
                                            std::move(parameters), std::move(moments), start_step));
  return mend::OkStatus();
}

// Waits up to `wait_ms` (< 0: no limit) for the pending step.
mend_status AwaitPending(mend_learner& learner, int64_t wait_ms) {
  if (wait_ms >= 0 &&
      learner.pending.wait_for(std::chrono::milliseconds(wait_ms)) != std::future_status::ready) {
    return MEND_PENDING;
  }
  mend::Status status = learner.pending.get();
  EndCall(learner);
  return Return(status);
}

}  // namespace

extern "C" {

mend_status mend_learner_create(const mend_config* config, const char* token,
                                const char* learner_id, const mend_buffer* parameters, size_t count,
                                uint64_t start_step, mend_learner** out) {
  return mend_learner_create_sharded(config, token, learner_id, parameters, nullptr, count,
                                     start_step, out);
}

mend_status mend_learner_create_sharded(const mend_config* config, const char* token,
                                        const char* learner_id, const mend_buffer* parameters,
                                        const uint64_t* replica_keys, size_t count,
                                        uint64_t start_step, mend_learner** out) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_learner_create", "config");
    if (token == nullptr) return NullArgument("mend_learner_create", "token");
    if (learner_id == nullptr || *learner_id == '\0')
      return NullArgument("mend_learner_create", "learner_id");
    if (out == nullptr) return NullArgument("mend_learner_create", "out");
    if (mend::Status rule = mend::CheckJobToken(token, "the caller"); !rule.ok())
      return Return(rule);
    auto buffers = Buffers(parameters, count);
    if (!buffers.ok()) return Return(buffers.status());
    if (replica_keys != nullptr) {
      for (size_t i = 0; i < count; ++i) (*buffers)[i].replica_key = replica_keys[i];
    }
    auto learner = std::make_unique<mend_learner>();
    learner->owner = getpid();
    mend::Status created = Create(config->value, config->job_settings, token, learner_id,
                                  std::move(*buffers), start_step, *learner);
    if (!created.ok()) return Return(created);
    learner->last_flags = Writes(*learner) != 0 ? MEND_STEP_WROTE : 0;
    RecordTouched(*learner);
    *out = learner.release();
    return MEND_OK;
  });
}

mend_status mend_learner_set_moments(mend_learner* learner, size_t index, float* first,
                                     float* second) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_set_moments"); !usable.ok())
      return Return(usable);
    if (index >= learner->parameters->count()) {
      return Fail(mend::InvalidArgumentError(
          fmt::format("mend_learner_set_moments: no parameter {} (there are {})", index,
                      learner->parameters->count())));
    }
    if ((first == nullptr) != (second == nullptr) && learner->parameters->numel(index) > 0) {
      return Fail(mend::InvalidArgumentError(fmt::format(
          "mend_learner_set_moments: parameter {}: give both moments or neither", index)));
    }
    if (learner->moments != nullptr) learner->moments->Set(index, first, second);
    return MEND_OK;
  });
}

mend_status mend_learner_set_optimizer(mend_learner* learner, double beta1, double beta2,
                                       uint64_t* step) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_set_optimizer"); !usable.ok())
      return Return(usable);
    for (double beta : {beta1, beta2}) {
      if (!(beta >= 0.0 && beta < 1.0)) {
        return Fail(mend::InvalidArgumentError(fmt::format(
            "mend_learner_set_optimizer: betas ({}, {}): each must be in [0, 1)", beta1, beta2)));
      }
    }
    if (learner->moments != nullptr) learner->moments->SetOptimizer(beta1, beta2, step);
    return MEND_OK;
  });
}

mend_status mend_learner_set_buffers(mend_learner* learner, const mend_buffer* buffers,
                                     size_t count, uint32_t kind) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_set_buffers"); !usable.ok())
      return Return(usable);
    if (kind != MEND_BUFFERS_AVERAGED && kind != MEND_BUFFERS_FROM_FIRST_MEMBER) {
      return Fail(mend::InvalidArgumentError(
          fmt::format("mend_learner_set_buffers: unknown kind {}", kind)));
    }
    if (learner->buffers[kind] != nullptr) {
      return Fail(mend::FailedPreconditionError(
          "mend_learner_set_buffers: buffers of that kind were set already"));
    }
    auto raw = Buffers(buffers, count, "mend_learner_set_buffers");
    if (!raw.ok()) return Return(raw.status());
    auto owned = std::make_unique<mend::capi::RawParameters>(std::move(*raw));
    mend::capi::RawParameters* pointer = owned.get();
    mend::Status set =
        learner->driver->SetBuffers(kind == MEND_BUFFERS_FROM_FIRST_MEMBER, std::move(owned));
    if (set.ok()) learner->buffers[kind] = pointer;
    return Return(set);
  });
}

uint32_t mend_learner_plan_step(mend_learner* learner) {
  if (!Usable(learner, "mend_learner_plan_step").ok() || learner->shut_down) return 0;
  mend::reducer::StepPlan plan = learner->driver->PlanStep();
  learner->planned = std::move(plan.fragments);
  learner->planned_flags = (plan.may_wait ? MEND_STEP_MAY_WAIT : 0u) |
                           (plan.touches_parameters ? MEND_STEP_READS : 0u) |
                           (plan.may_write ? MEND_STEP_MAY_WRITE : 0u) |
                           (plan.launch_due_next ? MEND_STEP_DUE_NEXT : 0u);
  return learner->planned_flags;
}

mend_status mend_learner_step(mend_learner* learner, uint64_t tokens, int64_t wait_ms) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_step"); !usable.ok())
      return Return(usable);
    if (learner->shut_down)
      return Fail(mend::FailedPreconditionError("mend_learner_step: after shutdown"));
    BeginCall(*learner);
    if (!learner->driver->NextStepMayWait()) {  // most steps: bookkeeping only
      mend::Status status = learner->driver->step(tokens);
      EndCall(*learner);
      return Return(status);
    }
    mend::reducer::RoundDriver* driver = learner->driver.get();
    learner->pending =
        std::async(std::launch::async, [driver, tokens] { return driver->step(tokens); });
    return AwaitPending(*learner, wait_ms);
  });
}

mend_status mend_learner_wait(mend_learner* learner, int64_t wait_ms) {
  return Guarded([&] {
    if (learner == nullptr) return NullArgument("mend_learner_wait", "learner");
    if (!learner->pending.valid()) {
      return Fail(mend::FailedPreconditionError("mend_learner_wait: no step is waiting"));
    }
    return AwaitPending(*learner, wait_ms);
  });
}

void mend_learner_interrupt(mend_learner* learner) {
  if (learner != nullptr && learner->session != nullptr && getpid() == learner->owner)
    learner->session->agent().Interrupt();
}

uint32_t mend_learner_last_flags(const mend_learner* learner) {
  return learner != nullptr ? learner->last_flags : 0;
}

mend_status mend_learner_stats(const mend_learner* learner, mend_stats* out) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_stats"); !usable.ok())
      return Return(usable);
    if (out == nullptr) return NullArgument("mend_learner_stats", "out");
    const mend::ReducerStats s = learner->driver->stats();
    *out = {s.steps,
            s.rounds_started,
            s.rounds,
            s.failed_rounds,
            s.passed_over,
            s.heals,
            s.moment_syncs,
            s.bytes_sent,
            s.cross_rack_bytes_sent,
            s.last_round_id,
            s.checkpoints,
            s.checkpoint_failures,
            s.resumed_from_round,
            s.overlap_steps,
            s.parameter_copies,
            s.round_waits,
            s.most_rounds_in_flight,
            s.rounds_made_in_merge,
            s.group_bytes_sent,
            s.group_state_bytes_sent};
    return MEND_OK;
  });
}

mend_status mend_learner_round_phases(const mend_learner* learner, mend_round_phases* out) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_round_phases"); !usable.ok())
      return Return(usable);
    if (out == nullptr) return NullArgument("mend_learner_round_phases", "out");
    const mend::RoundPhases p = learner->driver->stats().phases;
    *out = {p.snapshot, p.join,       p.agree_or_heal,       p.encode, p.transfer,
            p.reduce,   p.outer_step, p.moments_and_buffers, p.round};
    return MEND_OK;
  });
}

int mend_learner_fragments(const mend_learner* learner) {
  return Usable(learner, "mend_learner_fragments").ok() ? learner->driver->fragments() : 0;
}

int mend_learner_parameter_fragment(const mend_learner* learner, uint64_t index) {
  if (!Usable(learner, "mend_learner_parameter_fragment").ok() ||
      index >= learner->parameters->count())
    return -1;
  return static_cast<int>(FragmentOf(*learner, index));
}

mend_status mend_learner_step_fragments(const mend_learner* learner, uint32_t which, uint8_t* out,
                                        uint64_t count) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_step_fragments"); !usable.ok())
      return Return(usable);
    const auto fragments = static_cast<uint64_t>(learner->driver->fragments());
    if (out == nullptr) return NullArgument("mend_learner_step_fragments", "out");
    if (count != fragments) {
      return Fail(mend::InvalidArgumentError(fmt::format(
          "mend_learner_step_fragments: count is {}; the learner has {} fragments (one byte each)",
          count, fragments)));
    }
    const std::vector<uint8_t>* from = nullptr;
    switch (which) {
      case MEND_FRAGMENTS_PLANNED:
        from = &learner->planned;
        break;
      case MEND_FRAGMENTS_READ:
        from = &learner->touched[0];
        break;
      case MEND_FRAGMENTS_WROTE:
        from = &learner->touched[1];
        break;
      default:
        return Fail(mend::InvalidArgumentError(
            fmt::format("mend_learner_step_fragments: unknown which {}", which)));
    }
    for (uint64_t f = 0; f < count; ++f) {
      // No plan fixed: the step may touch every fragment.
      out[f] = from->empty() ? (which == MEND_FRAGMENTS_PLANNED ? 1 : 0) : (*from)[f];
    }
    return MEND_OK;
  });
}

mend_status mend_learner_global_state(const mend_learner* learner, int fragment, float* out,
                                      uint64_t capacity, uint64_t* count) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_global_state"); !usable.ok())
      return Return(usable);
    if (count == nullptr) return NullArgument("mend_learner_global_state", "count");
    if (fragment < 0 || fragment >= learner->driver->fragments()) {
      return Fail(
          mend::OutOfRangeError(fmt::format("mend_learner_global_state: fragment {} (there are {})",
                                            fragment, learner->driver->fragments())));
    }
    std::span<const float> global = learner->driver->global(fragment);
    *count = global.size();
    if (out != nullptr)
      std::copy_n(global.begin(), std::min<uint64_t>(capacity, global.size()), out);
    return MEND_OK;
  });
}

mend_status mend_learner_export_state(mend_learner* learner, void** bytes, uint64_t* size) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_export_state"); !usable.ok())
      return Return(usable);
    if (bytes == nullptr) return NullArgument("mend_learner_export_state", "bytes");
    if (size == nullptr) return NullArgument("mend_learner_export_state", "size");
    mend::StatusOr<std::string> state = learner->driver->ExportState();
    if (!state.ok()) return Return(state.status());
    *bytes = std::malloc(std::max<size_t>(state->size(), 1));
    if (*bytes == nullptr)
      return Fail(mend::ResourceExhaustedError("mend_learner_export_state: out of memory"));
    std::memcpy(*bytes, state->data(), state->size());
    *size = state->size();
    return MEND_OK;
  });
}

mend_status mend_learner_import_state(mend_learner* learner, const void* bytes, uint64_t size,
                                      uint32_t flags) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_import_state"); !usable.ok())
      return Return(usable);
    if (bytes == nullptr && size > 0) return NullArgument("mend_learner_import_state", "bytes");
    if ((flags & ~MEND_IMPORT_KEEP_PARAMETERS) != 0) {
      return Fail(mend::InvalidArgumentError(
          fmt::format("mend_learner_import_state: unknown flags {:#x}", flags)));
    }
    BeginCall(*learner);
    mend::Status status =
        learner->driver->ImportState(std::string_view(static_cast<const char*>(bytes), size),
                                     (flags & MEND_IMPORT_KEEP_PARAMETERS) != 0);
    EndCall(*learner);
    return Return(status);
  });
}

mend_status mend_learner_own_values(const mend_learner* learner, uint64_t* values) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_own_values"); !usable.ok())
      return Return(usable);
    if (values == nullptr) return NullArgument("mend_learner_own_values", "values");
    *values = learner->driver->OwnValues();
    return MEND_OK;
  });
}

mend_status mend_learner_export_own_state(mend_learner* learner, float* global, float* momentum,
                                          uint64_t values, void** described, uint64_t* size) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_export_own_state"); !usable.ok())
      return Return(usable);
    if (global == nullptr && values > 0)
      return NullArgument("mend_learner_export_own_state", "global");
    if (momentum == nullptr && values > 0)
      return NullArgument("mend_learner_export_own_state", "momentum");
    if (described == nullptr) return NullArgument("mend_learner_export_own_state", "described");
    if (size == nullptr) return NullArgument("mend_learner_export_own_state", "size");
    mend::StatusOr<std::string> state =
        learner->driver->ExportOwn(std::span(global, values), std::span(momentum, values));
    if (!state.ok()) return Return(state.status());
    *described = std::malloc(std::max<size_t>(state->size(), 1));
    if (*described == nullptr)
      return Fail(mend::ResourceExhaustedError("mend_learner_export_own_state: out of memory"));
    std::memcpy(*described, state->data(), state->size());
    *size = state->size();
    return MEND_OK;
  });
}

mend_status mend_learner_import_own_state(mend_learner* learner, const float* global,
                                          const float* momentum, uint64_t values,
                                          const void* described, uint64_t size) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_import_own_state"); !usable.ok())
      return Return(usable);
    if (global == nullptr && values > 0)
      return NullArgument("mend_learner_import_own_state", "global");
    if (momentum == nullptr && values > 0)
      return NullArgument("mend_learner_import_own_state", "momentum");
    if (described == nullptr) return NullArgument("mend_learner_import_own_state", "described");
    BeginCall(*learner);
    mend::Status status =
        learner->driver->ImportOwn(std::string_view(static_cast<const char*>(described), size),
                                   std::span(global, values), std::span(momentum, values));
    EndCall(*learner);
    return Return(status);
  });
}

mend_status mend_learner_save_checkpoint(mend_learner* learner, const char* path) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_save_checkpoint"); !usable.ok())
      return Return(usable);
    if (path == nullptr) return NullArgument("mend_learner_save_checkpoint", "path");
    return Return(learner->driver->SaveCheckpoint(path));
  });
}

mend_status mend_learner_shutdown(mend_learner* learner) {
  return Guarded([&] {
    if (mend::Status usable = Usable(learner, "mend_learner_shutdown"); !usable.ok())
      return Return(usable);
    if (learner->shut_down) return MEND_OK;
    BeginCall(*learner);
    mend::Status status = learner->driver->shutdown();
    EndCall(*learner);
    learner->shut_down = true;
    return Return(status);
  });
}

void mend_learner_free(mend_learner* learner) {
  if (learner == nullptr) return;
  // A forked child: the learner's threads do not exist there, so nothing of
  // it can be torn down; it is left as it is.
  if (getpid() != learner->owner) return;
  (void)Guarded([&] {
    if (learner->pending.valid()) {  // called off: the waiting step returns ABORTED
      learner->session->agent().Interrupt();
      (void)learner->pending.get();
    }
    learner->driver.reset();
    learner->session.reset();
    delete learner;
    return MEND_OK;
  });
}

}  // extern "C"

// The driver's construction, and its calls on the outer state (resume,
// export, import, checkpoints) between rounds.
#include <utility>

#include "core/status_format.h"
#include "fmt/format.h"
#include "reducer/round_driver_impl.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

RoundDriverImpl::RoundDriverImpl(RoundOptions options, const Clock& clock, std::string learner_id,
                                 FragmentSchedule schedule, std::unique_ptr<Codec> codec,
                                 std::unique_ptr<RoundPolicy> policy,
                                 std::unique_ptr<FlatParameters> parameters,
                                 std::unique_ptr<FlatMoments> moments)
    : clock_(clock),
      options_(std::move(options)),
      policy_(std::move(policy)),
      schedule_(schedule),
      parameters_(std::move(parameters)),
      moments_(std::move(moments)),
      codec_(std::move(codec)),
      outer_(options_.checkpoints, *parameters_, schedule_, &stats_.parameter_copies, pool_,
             *policy_, std::move(learner_id)),
      overlap_(options_.overlap_steps,
               std::max<uint64_t>(1, options_.rounds_in_flight * outer_.book().period() - 1),
               policy_->AppliedOnArrival()) {
  options_.sync.codec = codec_.get();
}

Status RoundDriverImpl::Init(uint64_t start_step, std::unique_ptr<RoundServices> services) {
  stats_.steps = start_step;
  services = policy_->Services(std::move(services));
  diagnostics_ = std::make_unique<Diagnostics>(options_.diagnostics_dir,
                                               policy_->DiagnosticsName(services->learner_id()));
  flights_ =
      std::make_unique<Flights>(FlightsContext{clock_, options_, schedule_, *policy_, outer_,
                                               moments_.get(), stats_, overlap_, *diagnostics_},
                                std::move(services));
  if (parameters_->count() == 0)
    return InvalidArgumentError("reducer: the model has no parameters");
  MEND_RETURN_IF_ERROR(options_.CheckMoments(moments_ != nullptr));
  MEND_ASSIGN_OR_RETURN(std::optional<Restored> restored, outer_.Start(start_step));
  if (restored) {
    MoveTo(*restored);
    stats_.resumed_from_round = restored->round_id;
    if (options_.final_merge_step > 0 && restored->step >= options_.final_merge_step) {
      spdlog::warn(
          "learner '{}': the job finished: its checkpoint of round {} is of its last step {}. This "
          "learner holds the job's final model and has nothing to train (Python: "
          "runtime.finished is True; steps past the end are dropped at shutdown)",
          flights_->services().learner_id(), restored->round_id, restored->step);
    }
  }
  outer_.book().StartPrefault(/*own=*/options_.concurrent,
                              /*step=*/options_.concurrent && options_.apply == OuterApply::kEager);
  return OkStatus();
}

// After a restore: the learner's last round and step are the restored ones.
void RoundDriverImpl::MoveTo(const Restored& restored) {
  stats_.last_round_id = restored.round_id;
  stats_.steps = restored.step;
  flights_->StepNow(restored.step);
}

// FAILED_PRECONDITION for an import (`call`) while a round is in flight.
Status RoundDriverImpl::BetweenRounds(std::string_view call) const {
  if (flights_->empty()) return OkStatus();
  return FailedPreconditionError(
      fmt::format("{}: the round of fragment {} for step {} is in flight; import between rounds "
                  "(before the first step, or after shutdown of the job that exported it)",
                  call, flights_->head().fragment, flights_->head().boundary_step));
}

StatusOr<std::string> RoundDriverImpl::ExportState() {
  if (shut_down_) return FailedPreconditionError("reducer: export_state() after shutdown()");
  return outer_.Export(Now());
}

Status RoundDriverImpl::ImportState(std::string_view bytes, bool keep_parameters) {
  if (shut_down_) return FailedPreconditionError("reducer: import_state() after shutdown()");
  MEND_RETURN_IF_ERROR(BetweenRounds("import_state"));
  MEND_ASSIGN_OR_RETURN(Restored restored, outer_.Import(bytes, keep_parameters));
  MoveTo(restored);
  return OkStatus();
}

StatusOr<std::string> RoundDriverImpl::ExportOwn(std::span<float> global,
                                                 std::span<float> momentum) {
  if (shut_down_) return FailedPreconditionError("reducer: export_own_state() after shutdown()");
  if (global.size() != OwnValues() || momentum.size() != OwnValues()) {
    return InvalidArgumentError(
        fmt::format("export_own_state: buffers of {} and {} values for this rank's {}",
                    global.size(), momentum.size(), OwnValues()));
  }
  return outer_.ExportOwn(Now(), global, momentum);
}

Status RoundDriverImpl::ImportOwn(std::string_view described, std::span<const float> global,
                                  std::span<const float> momentum) {
  if (shut_down_) return FailedPreconditionError("reducer: import_own_state() after shutdown()");
  if (global.size() != OwnValues() || momentum.size() != OwnValues()) {
    return InvalidArgumentError(fmt::format("import_own_state: {} and {} values for this rank's {}",
                                            global.size(), momentum.size(), OwnValues()));
  }
  MEND_RETURN_IF_ERROR(BetweenRounds("import_own_state"));
  MEND_ASSIGN_OR_RETURN(Restored restored, outer_.ImportOwn(described, global, momentum));
  MoveTo(restored);
  return OkStatus();
}

Status RoundDriverImpl::SaveCheckpoint(const std::string& path) { return outer_.Save(path, Now()); }

Status RoundDriverImpl::SetBuffers(bool from_first_member,
                                   std::unique_ptr<FlatParameters> buffers) {
  if (stepped_ || !flights_->empty()) {
    return FailedPreconditionError(
        "reducer: the model's buffers are handed over before the first step");
  }
  flights_->SetBuffers(from_first_member ? 1 : 0, std::move(buffers));
  return OkStatus();
}

}  // namespace mend::reducer

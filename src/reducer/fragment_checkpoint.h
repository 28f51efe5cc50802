// Checkpoints of the round driver's fragments: every fragment's global
// state and outer momentum as tensors named by parameter ("global/NAME",
// "outer_momentum/NAME"), so that a job resumes with any number of learners
// and any fragment count; and the background writer (one write at a time).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mend/checkpoint.h"
#include "mend/status.h"
#include "reducer/flat_state.h"
#include "reducer/fragments.h"

namespace mend::reducer {

// Appends every fragment's global state and momentum to `checkpoint`.
void AddFragmentTensors(const FlatParameters& parameters, const std::vector<Fragment>& fragments,
                        Checkpoint* checkpoint);

// Appends this learner's error feedback (sparse codecs) of every fragment
// that has any, as "error_feedback/NAME" (an exported state's, not a
// checkpoint file's: it is the learner's own).
void AddResidualTensors(const FlatParameters& parameters, const std::vector<Fragment>& fragments,
                        Checkpoint* checkpoint);
// Each fragment's error feedback from `checkpoint`; empty where it has none.
std::vector<std::vector<float>> FragmentResiduals(const Checkpoint& checkpoint,
                                                  const FlatParameters& parameters,
                                                  const std::vector<Fragment>& fragments);

// Each fragment's (global state, momentum) from `checkpoint`, by parameter
// name. INVALID_ARGUMENT naming the tensor that is missing or has another
// shape than the model's (`where` says which checkpoint, for the message).
[[nodiscard]] StatusOr<std::vector<std::pair<std::vector<float>, std::vector<float>>>>
FragmentStates(const Checkpoint& checkpoint, const FlatParameters& parameters,
               const std::vector<Fragment>& fragments, const std::string& where);

// Saves checkpoints into a CheckpointDirectory on a background thread, one
// at a time (a new write first joins the last); failures are logged and
// counted, training goes on.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointDirectory directory) : directory_(std::move(directory)) {}
  ~CheckpointWriter() { Join(); }
  void Write(std::shared_ptr<const Checkpoint> checkpoint);
  void Join();
  uint64_t written() const { return written_.load(); }
  uint64_t failed() const { return failed_.load(); }

 private:
  CheckpointDirectory directory_;  // used by one write at a time
  std::thread thread_;
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> failed_{0};
};

}  // namespace mend::reducer

// mend's error values: abseil's Status and StatusOr (gRPC already depends on
// them), with the canonical codes used on purpose:
//   DEADLINE_EXCEEDED  a wait ran past its timeout
//   UNAVAILABLE        the peer or service cannot be reached; retry the call
//   ABORTED            membership changed under the operation; redo the round
//   FAILED_PRECONDITION fix the state first (e.g. a superseded session)
//   INVALID_ARGUMENT   bad input; the message names the field and the value
//   UNAUTHENTICATED    missing or wrong job token
//   CANCELLED          its caller stopped the call (CallCanceller)
//   NOT_FOUND          the lighthouse does not know the learner (register again)
// Thread-safety: values, safe to copy between threads.
#pragma once

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mend {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;
using StatusCode = absl::StatusCode;

using absl::AbortedError;
using absl::AlreadyExistsError;
using absl::CancelledError;
using absl::DataLossError;
using absl::DeadlineExceededError;
using absl::FailedPreconditionError;
using absl::InternalError;
using absl::InvalidArgumentError;
using absl::NotFoundError;
using absl::OkStatus;
using absl::OutOfRangeError;
using absl::PermissionDeniedError;
using absl::ResourceExhaustedError;
using absl::UnauthenticatedError;
using absl::UnavailableError;

// The message of `status` as a std::string_view (Debian's abseil has its own
// string_view type).
inline std::string_view StatusMessage(const Status& status) {
  return std::string_view(status.message().data(), status.message().size());
}

// Returns `status` with `context + ": "` in front of its message.
Status Annotate(const Status& status, std::string_view context);

}  // namespace mend

#define MEND_STATUS_CONCAT_INNER_(a, b) a##b
#define MEND_STATUS_CONCAT_(a, b) MEND_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define MEND_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::mend::Status mend_status_ = (expr);        \
    if (!mend_status_.ok()) return mend_status_; \
  } while (false)

// `lhs = value of expr`, or returns its error from the enclosing function.
#define MEND_ASSIGN_OR_RETURN(lhs, expr) \
  MEND_ASSIGN_OR_RETURN_IMPL_(MEND_STATUS_CONCAT_(mend_statusor_, __LINE__), lhs, expr)
#define MEND_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

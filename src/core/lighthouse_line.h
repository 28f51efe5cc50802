// The line `mend lighthouse` prints on its stdout once it serves, and what
// starts a lighthouse process (tests, benchmarks) reads back from it:
//   mend lighthouse grpc=HOST:PORT http=HOST:PORT
// (http= is empty without the status page).
//
// Thread-safety: pure functions; AwaitLighthouseAddress as Subprocess.
#pragma once

#include <string>
#include <string_view>

#include "core/subprocess.h"
#include "mend/clock.h"
#include "mend/status.h"

namespace mend {

std::string LighthouseServingLine(std::string_view grpc_address, std::string_view http_address);

// The gRPC address of a serving line; INVALID_ARGUMENT quoting `line` when
// it is not one.
[[nodiscard]] StatusOr<std::string> GrpcAddressOfServingLine(std::string_view line);

// Reads the serving line of `lighthouse` (started with its stdout to
// "pipe") within `timeout` and returns its gRPC address. The error of a
// lighthouse that exited or printed something else says so.
[[nodiscard]] StatusOr<std::string> AwaitLighthouseAddress(Subprocess& lighthouse, Micros timeout);

}  // namespace mend

// What RoundDriver::Create takes for a test's configuration.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "mend/config.h"
#include "reducer/options_from_config.h"
#include "test_util/job_config.h"

namespace mend::testing_util {

// RoundDriverOptionsOf `config` (CheckedForTest); a configuration it
// cannot make options of aborts the same way.
inline reducer::RoundDriverOptions DriverOptionsFor(const Config& config) {
  StatusOr<reducer::RoundDriverOptions> options =
      reducer::RoundDriverOptionsOf(CheckedForTest(config));
  if (!options.ok()) {
    std::fprintf(stderr, "a test's configuration has no round options: %s\n",
                 options.status().ToString().c_str());
    std::abort();
  }
  return *std::move(options);
}

}  // namespace mend::testing_util

// What RoundDriver::Create takes for a test's configuration.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "mend/config.h"
#include "reducer/options_from_config.h"

namespace mend::testing_util {

// RoundDriverOptionsOf `config`, which the test made valid: a configuration
// the check refuses is the test's mistake, and aborts naming it.
inline reducer::RoundDriverOptions DriverOptionsFor(const Config& config) {
  StatusOr<ValidConfig> valid = ValidConfig::Check(config);
  StatusOr<reducer::RoundDriverOptions> options =
      valid.ok() ? reducer::RoundDriverOptionsOf(*valid) : valid.status();
  if (!options.ok()) {
    std::fprintf(stderr, "a test's configuration is not valid: %s\n",
                 options.status().ToString().c_str());
    std::abort();
  }
  return *std::move(options);
}

}  // namespace mend::testing_util

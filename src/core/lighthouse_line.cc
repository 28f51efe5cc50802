#include "core/lighthouse_line.h"

#include "fmt/format.h"

namespace mend {

namespace {
constexpr std::string_view kPrefix = "mend lighthouse grpc=";
constexpr std::string_view kHttp = " http=";
}  // namespace

std::string LighthouseServingLine(std::string_view grpc_address, std::string_view http_address) {
  return fmt::format("{}{}{}{}", kPrefix, grpc_address, kHttp, http_address);
}

StatusOr<std::string> GrpcAddressOfServingLine(std::string_view line) {
  const size_t http = line.find(kHttp);
  if (!line.starts_with(kPrefix) || http == std::string_view::npos || http == kPrefix.size()) {
    return InvalidArgumentError(
        fmt::format("'{}' is not the line of a serving lighthouse ('{}HOST:PORT{}HOST:PORT')", line,
                    kPrefix, kHttp));
  }
  return std::string(line.substr(kPrefix.size(), http - kPrefix.size()));
}

StatusOr<std::string> AwaitLighthouseAddress(Subprocess& lighthouse, Micros timeout) {
  StatusOr<std::string> line = lighthouse.ReadLine(timeout);
  if (!line.ok()) {
    return Status(line.status().code(),
                  fmt::format("the lighthouse did not say where it serves: {}",
                              StatusMessage(line.status())));
  }
  return GrpcAddressOfServingLine(*line);
}

}  // namespace mend

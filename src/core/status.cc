#include "mend/status.h"

#include <string>

namespace mend {

Status Annotate(const Status& status, std::string_view context) {
  if (status.ok()) return status;
  std::string message(context);
  message += ": ";
  message.append(status.message().data(), status.message().size());
  return Status(status.code(), message);
}

}  // namespace mend

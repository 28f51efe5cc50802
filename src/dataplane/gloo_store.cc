#include "dataplane/gloo_store.h"

#include <algorithm>

namespace mend::dataplane {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  Status status = store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
  if (!status.ok()) throw StoreFailure(status);
}

std::vector<char> GlooStore::get(const std::string& key) {
  auto value = store_.Get(prefix_ + key, timeout_.count() * kMicrosPerMilli);
  if (value.status().code() == StatusCode::kDeadlineExceeded) throw StoreTimeout({prefix_ + key});
  if (!value.ok()) throw StoreFailure(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& /*gloo_timeout*/) {
  // Gloo passes its context's timeout, which Communicator::Connect sets to
  // bound a pair's initial connection (a fifth of connect_timeout). The
  // rendezvous waits the round's own timeout instead: a member whose last
  // round failed only at its deadline arrives that much later than one
  // whose round failed at once, and must still meet it.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    auto value = store_.Get(prefix_ + key, std::max<Micros>(left.count(), 0));
    if (value.status().code() == StatusCode::kDeadlineExceeded ||
        value.status().code() == StatusCode::kNotFound) {
      missing.push_back(prefix_ + key);
      continue;
    }
    if (!value.ok()) throw StoreFailure(value.status());
  }
  if (!missing.empty()) throw StoreTimeout(missing);
}

}  // namespace mend::dataplane

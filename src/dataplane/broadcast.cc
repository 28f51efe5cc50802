// The Gloo communicator's broadcast, in segments (a heal streams its chunks
// with it).
#include <algorithm>

#include "dataplane/gloo_communicator.h"
#include "fmt/format.h"

namespace mend::dataplane {

Status GlooCommunicator::BroadcastImpl(std::span<std::byte> data, int root) {
  Op op;
  MEND_RETURN_IF_ERROR(Begin("broadcast", &op));
  op.salt = SizeSalt(data.size());  // (as AllGatherImpl's)
  if (root < 0 || root >= options_.world_size) {
    return InvalidArgumentError(fmt::format("round {}: broadcast: root {} not in [0, {})",
                                            options_.round_id, root, options_.world_size));
  }
  std::vector<Transfer> transfers;
  const size_t segment = std::max<size_t>(options_.segment_bytes, 1);
  for (size_t start = 0, s = 0; start < data.size(); start += segment, ++s) {
    size_t bytes = std::min(segment, data.size() - start);
    if (options_.rank == root) {
      for (int peer = 0; peer < options_.world_size; ++peer) {
        if (peer != root)
          transfers.push_back(PostSend(op, peer, kBroadcast, s, data.data() + start, bytes));
      }
    } else {
      transfers.push_back(PostRecv(op, root, kBroadcast, s, data.data() + start, bytes));
    }
  }
  return End(op, WaitAll(op, transfers));
}

}  // namespace mend::dataplane

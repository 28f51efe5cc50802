#include "wire/receive_batch.h"

#include "wire/datagram.h"

namespace mend::coordinator::datagram {

ReceiveBatch::ReceiveBatch(int size)
    : buffers_(static_cast<size_t>(size) * kMaxDatagramBytes),
      messages_(static_cast<size_t>(size)),
      vectors_(static_cast<size_t>(size)),
      senders_(static_cast<size_t>(size)) {}

int ReceiveBatch::Receive(int socket) {
  for (size_t i = 0; i < messages_.size(); ++i) {
    vectors_[i] = {buffers_.data() + i * kMaxDatagramBytes, kMaxDatagramBytes};
    messages_[i] = {};
    messages_[i].msg_hdr.msg_iov = &vectors_[i];
    messages_[i].msg_hdr.msg_iovlen = 1;
    messages_[i].msg_hdr.msg_name = &senders_[i].storage;
    messages_[i].msg_hdr.msg_namelen = sizeof senders_[i].storage;
  }
  const int got = recvmmsg(socket, messages_.data(), static_cast<unsigned>(messages_.size()),
                           MSG_DONTWAIT, nullptr);
  for (int i = 0; i < got; ++i) senders_[i].length = messages_[i].msg_hdr.msg_namelen;
  return got > 0 ? got : 0;
}

std::string_view ReceiveBatch::bytes(int i) const {
  const size_t at = static_cast<size_t>(i);
  return {buffers_.data() + at * kMaxDatagramBytes, messages_[at].msg_len};
}

bool ReceiveBatch::truncated(int i) const {
  return (messages_[static_cast<size_t>(i)].msg_hdr.msg_flags & MSG_TRUNC) != 0;
}

}  // namespace mend::coordinator::datagram

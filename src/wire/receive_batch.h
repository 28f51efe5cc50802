// Datagrams received a batch at a time (recvmmsg): a fixed number of
// buffers of kMaxDatagramBytes each, and the senders' addresses, set up once
// and reused by every call. Both ends of the datagram channel read their
// socket with one.
//
// Thread-safety: one thread at a time; what bytes() and sender() return
// holds until the next Receive().
#pragma once

#include <sys/socket.h>

#include <string_view>
#include <vector>

namespace mend::coordinator::datagram {

// A datagram's sender.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

class ReceiveBatch {
 public:
  explicit ReceiveBatch(int size);
  ReceiveBatch(const ReceiveBatch&) = delete;
  ReceiveBatch& operator=(const ReceiveBatch&) = delete;

  int size() const { return static_cast<int>(messages_.size()); }
  // Receives the datagrams waiting on `socket`, up to size(), without
  // blocking; returns how many (0: none, or an error of the socket).
  int Receive(int socket);
  // Datagram i of the last Receive(): its bytes, whether it was longer than
  // a buffer (and cut), and who sent it.
  std::string_view bytes(int i) const;
  bool truncated(int i) const;
  const SocketAddress& sender(int i) const { return senders_[static_cast<size_t>(i)]; }

 private:
  std::vector<char> buffers_;
  std::vector<mmsghdr> messages_;
  std::vector<iovec> vectors_;
  std::vector<SocketAddress> senders_;
};

}  // namespace mend::coordinator::datagram

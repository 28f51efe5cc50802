#include "learner/datagram_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"
#include "wire/receive_batch.h"

namespace mend::coordinator {
namespace {

constexpr int kBatch = 64;
constexpr int kSocketBufferBytes = 16 << 20;

// Sequence numbers start at the wall clock in microseconds, so a client made
// again for the same session (same process) still counts upwards.
uint64_t InitialSeq() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

DatagramClient::DatagramClient(const std::string& token, int socket)
    : key_(datagram::DeriveKey(token)),
      socket_(socket),
      send_signer_(key_),
      next_seq_(InitialSeq()) {}

namespace {

// Resolves host:port and connects `fd` to it, creating the socket when fd < 0.
StatusOr<int> ConnectUdp(int fd, const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    return InvalidArgumentError(
        fmt::format("udp {}:{}: cannot resolve: {}", host, port, gai_strerror(error)));
  }
  bool created = fd < 0;
  if (created) fd = socket(found->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int connected = fd >= 0 ? connect(fd, found->ai_addr, found->ai_addrlen) : -1;
  freeaddrinfo(found);
  if (connected != 0) {
    std::string why = std::strerror(errno);
    if (created && fd >= 0) close(fd);
    return UnavailableError(fmt::format("udp {}:{}: {}", host, port, why));
  }
  return fd;
}

}  // namespace

Status DatagramClient::Retarget(const std::string& host, int port) {
  return ConnectUdp(socket_, host, port).status();
}

StatusOr<std::unique_ptr<DatagramClient>> DatagramClient::Open(const std::string& host, int port,
                                                               const std::string& token) {
  MEND_ASSIGN_OR_RETURN(int fd, ConnectUdp(-1, host, port));
  int bytes = kSocketBufferBytes;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
  std::unique_ptr<DatagramClient> client(new DatagramClient(token, fd));
  client->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  client->thread_ = std::thread([raw = client.get()]() { raw->Receive(); });
  return client;
}

DatagramClient::~DatagramClient() {
  stopping_ = true;
  uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) < 0) {
    // The receiving thread notices stopping_ within its poll timeout.
  }
  if (thread_.joinable()) thread_.join();
  close(socket_);
  close(wake_fd_);
}

void DatagramClient::Attach(uint64_t session_id, Callbacks callbacks) {
  MutexLock lock(mu_);
  sessions_[session_id] = Session{std::make_shared<Callbacks>(std::move(callbacks)), 0};
}

void DatagramClient::Detach(uint64_t session_id) {
  MutexLock lock(mu_);
  sessions_.erase(session_id);
}

void DatagramClient::SendHeartbeats(
    const std::vector<std::pair<uint64_t, v1::HeartbeatRequest>>& beats) {
  MutexLock lock(send_mu_);
  std::vector<std::string> datagrams;
  datagrams.reserve(beats.size());
  for (const auto& [session, body] : beats) {
    datagrams.push_back(datagram::EncodeMessage({datagram::Kind::kHeartbeat, session, next_seq_++},
                                                body, send_signer_));
  }
  SendAll(datagrams);
}

void DatagramClient::SendJoins(const std::vector<std::pair<uint64_t, v1::DatagramJoin>>& joins) {
  MutexLock lock(send_mu_);
  std::vector<std::string> datagrams;
  datagrams.reserve(joins.size());
  for (const auto& [session, body] : joins) {
    datagrams.push_back(
        datagram::EncodeMessage({datagram::Kind::kJoin, session, next_seq_++}, body, send_signer_));
  }
  SendAll(datagrams);
}

void DatagramClient::SendAll(std::vector<std::string>& datagrams) {
  std::vector<mmsghdr> messages(std::min<size_t>(datagrams.size(), kBatch));
  std::vector<iovec> vectors(messages.size());
  for (size_t start = 0; start < datagrams.size();) {
    size_t n = std::min<size_t>(kBatch, datagrams.size() - start);
    for (size_t i = 0; i < n; ++i) {
      vectors[i] = {datagrams[start + i].data(), datagrams[start + i].size()};
      messages[i] = {};
      messages[i].msg_hdr.msg_iov = &vectors[i];
      messages[i].msg_hdr.msg_iovlen = 1;
    }
    int sent = sendmmsg(socket_, messages.data(), static_cast<unsigned>(n), 0);
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd out{socket_, POLLOUT, 0};
      if (poll(&out, 1, 100) <= 0) return;  // best effort: heartbeats and joins are resent
      continue;
    }
    // Other errors (e.g. ECONNREFUSED while the lighthouse is down) drop the
    // datagram; the sender's resends cover it.
    start += sent > 0 ? static_cast<size_t>(sent) : 1;
  }
}

// Hands one verified datagram of the session to its callbacks, by kind.
void DatagramClient::Dispatch(const Callbacks& callbacks, datagram::Kind kind,
                              std::string_view bytes) {
  switch (kind) {
    case datagram::Kind::kAck:
      if (auto ack = datagram::DecodeMessage<v1::HeartbeatResponse>(bytes);
          ack.ok() && callbacks.on_ack) {
        callbacks.on_ack(*ack);
      }
      break;
    case datagram::Kind::kDecision:
      if (auto decision = datagram::DecodeMessage<v1::DatagramDecision>(bytes);
          decision.ok() && callbacks.on_decision) {
        callbacks.on_decision(*decision);
      }
      break;
    case datagram::Kind::kUnknownSession:
      if (callbacks.on_session_ended) {
        callbacks.on_session_ended(NotFoundError(
            "the lighthouse does not know this session (restarted?); register again"));
      }
      break;
    case datagram::Kind::kSuperseded:
      if (callbacks.on_session_ended) {
        callbacks.on_session_ended(AlreadyExistsError(
            "another process registered with the lighthouse under this learner's id and "
            "replaced its session: two learners were given one id, or this one was restarted "
            "elsewhere"));
      }
      break;
    default:
      break;
  }
}

void DatagramClient::Receive() {
  datagram::Signer signer(key_);
  datagram::ReceiveBatch batch(kBatch);
  while (!stopping_.load()) {
    pollfd fds[2] = {{socket_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(fds, 2, 200);
    while (true) {
      const int got = batch.Receive(socket_);
      if (got == 0) break;
      for (int i = 0; i < got; ++i) {
        const std::string_view bytes = batch.bytes(i);
        auto header = datagram::ParseHeader(bytes);
        if (!header.ok() || !signer.Verify(bytes)) continue;
        std::shared_ptr<Callbacks> callbacks;
        {
          MutexLock lock(mu_);
          auto it = sessions_.find(header->session_id);
          if (it == sessions_.end() || header->seq <= it->second.last_seq) continue;
          it->second.last_seq = header->seq;
          callbacks = it->second.callbacks;
        }
        Dispatch(*callbacks, header->kind, bytes);
      }
      if (got < kBatch) break;
    }
  }
}

}  // namespace mend::coordinator

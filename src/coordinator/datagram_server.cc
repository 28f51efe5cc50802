#include "coordinator/datagram_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "wire/protocol_rules.h"

namespace mend::coordinator {
namespace {

constexpr int kBatch = 64;
constexpr int kSendBatch = 256;
constexpr int kSenders = 2;
constexpr int kMaxBatchesPerTurn = 32;
// The receiving thread waits for the senders while more than this many
// datagrams are queued (a round's decisions), at most kMaxYieldToSenders.
constexpr size_t kYieldBacklog = 512;
constexpr auto kMaxYieldToSenders = std::chrono::milliseconds(50);
constexpr int kSocketBufferBytes = 16 << 20;
// How often state of sessions the core no longer knows is dropped.
constexpr Micros kSweepInterval = 10 * kMicrosPerSecond;

// Asks for a large socket buffer: SO_*BUFFORCE when privileged, else the
// largest the system allows (net.core.rmem_max / wmem_max).
void GrowBuffer(int fd, int option, int force_option) {
  int bytes = kSocketBufferBytes;
  if (setsockopt(fd, SOL_SOCKET, force_option, &bytes, sizeof bytes) != 0) {
    setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof bytes);
  }
}

std::string AddressText(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  }
  return fmt::format("udp:{}:{}", host, port);
}

// What a datagram tells a learner whose session ended with `code`: a newer
// registration took its id (it must stop), or register again.
datagram::Kind SessionEndedKind(StatusCode code) {
  return wire::Superseded(code) ? datagram::Kind::kSuperseded : datagram::Kind::kUnknownSession;
}

}  // namespace

DatagramServer::DatagramServer(LighthouseCore* core, const std::string& token)
    : core_(core), handler_(core), key_(datagram::DeriveKey(token)), signer_(key_) {}

StatusOr<std::unique_ptr<DatagramServer>> DatagramServer::Start(const std::string& host, int port,
                                                                LighthouseCore* core,
                                                                const std::string& token) {
  std::unique_ptr<DatagramServer> server(new DatagramServer(core, token));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    return InvalidArgumentError(
        fmt::format("udp {}:{}: cannot resolve: {}", host, port, gai_strerror(error)));
  }
  int fd = socket(found->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int bound = fd >= 0 ? bind(fd, found->ai_addr, found->ai_addrlen) : -1;
  freeaddrinfo(found);
  if (bound != 0) {
    std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return UnavailableError(fmt::format("udp {}:{}: cannot bind: {}", host, port, why));
  }
  GrowBuffer(fd, SO_RCVBUF, SO_RCVBUFFORCE);
  GrowBuffer(fd, SO_SNDBUF, SO_SNDBUFFORCE);
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
  server->port_ = local.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  server->socket_ = fd;
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (int i = 0; i < kSenders; ++i) {
    auto sender = std::make_unique<Sender>();
    Sender* raw_sender = sender.get();
    sender->thread =
        std::thread([raw = server.get(), raw_sender]() { raw->RunSender(*raw_sender); });
    server->senders_.push_back(std::move(sender));
  }
  server->thread_ = std::thread([raw = server.get()]() { raw->Run(); });
  return server;
}

DatagramServer::~DatagramServer() { Stop(); }

void DatagramServer::Stop() {
  if (!stopping_.exchange(true)) {
    {
      MutexLock lock(backlog_mu_);
      backlog_drained_.NotifyAll();
    }
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0) {
      // The thread still sees stopping_ within its poll timeout.
    }
  }
  if (thread_.joinable()) thread_.join();
  for (auto& sender : senders_) {
    {
      MutexLock lock(sender->mu);
      sender->stopping = true;
      sender->ready.NotifyAll();
    }
    if (sender->thread.joinable()) sender->thread.join();
  }
  if (socket_ >= 0) close(socket_);
  if (wake_fd_ >= 0) close(wake_fd_);
  socket_ = wake_fd_ = -1;
}

void DatagramServer::Run() {
  datagram::ReceiveBatch batch(kBatch);
  Micros next_sweep = core_->clock()->NowMicros() + kSweepInterval;
  while (!stopping_.load()) {
    pollfd fds[2] = {{socket_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(fds, 2, 100);
    if (fds[1].revents & POLLIN) {
      uint64_t drained = 0;
      if (read(wake_fd_, &drained, sizeof drained) < 0) drained = 0;
    }
    {
      MutexLock lock(backlog_mu_);
      const auto yield_until = std::chrono::steady_clock::now() + kMaxYieldToSenders;
      while (backlog_.load() > kYieldBacklog && !stopping_.load() &&
             backlog_drained_.WaitUntil(backlog_mu_, yield_until)) {
      }
    }
    for (int turn = 0; turn < kMaxBatchesPerTurn; ++turn) {
      const int got = batch.Receive(socket_);
      if (got == 0) break;
      for (int i = 0; i < got; ++i) {
        counters_.received++;
        if (batch.truncated(i)) {
          counters_.dropped_malformed++;
          continue;
        }
        Handle(batch.bytes(i), batch.sender(i));
      }
      if (got < kBatch) break;
    }
    Micros now = core_->clock()->NowMicros();
    if (now >= next_sweep) {
      ForgetEndedSessions();
      next_sweep = now + kSweepInterval;
    }
  }
}

void DatagramServer::ForgetEndedSessions() {
  std::vector<uint64_t> sessions;
  {
    MutexLock lock(mu_);
    for (const auto& [session, peer] : peers_) sessions.push_back(session);
  }
  core_->KeepEndedSessions(sessions);
  MutexLock lock(mu_);
  for (uint64_t session : sessions) peers_.erase(session);
}

void DatagramServer::Handle(std::string_view bytes, const Address& from) {
  auto header = datagram::ParseHeader(bytes);
  if (!header.ok() ||
      (header->kind != datagram::Kind::kHeartbeat && header->kind != datagram::Kind::kJoin)) {
    counters_.dropped_malformed++;
    return;
  }
  if (!signer_.Verify(bytes)) {
    counters_.dropped_bad_mac++;
    core_->RecordRejection("UNAUTHENTICATED", AddressText(from.storage),
                           "datagram with a wrong MAC (wrong job token?)");
    return;
  }
  uint64_t session = header->session_id;
  std::string learner_id;
  {
    MutexLock lock(mu_);
    if (auto it = peers_.find(session); it != peers_.end()) {
      if (header->seq <= it->second.last_seq) {
        counters_.dropped_replayed++;
        return;
      }
      it->second.last_seq = header->seq;
      it->second.address = from;
      learner_id = it->second.learner_id;
    }
  }
  if (learner_id.empty()) {
    StatusOr<std::string> known = core_->SessionLearner(session);
    MutexLock lock(mu_);
    if (!known.ok()) {
      Outgoing reply;
      reply.session_id = session;
      reply.address = from;
      reply.kind = SessionEndedKind(known.status().code());
      Enqueue(std::move(reply));
      return;
    }
    Peer& peer = peers_[session];
    peer.learner_id = learner_id = *known;
    peer.last_seq = header->seq;
    peer.address = from;
  }
  if (header->kind == datagram::Kind::kHeartbeat) {
    if (!datagram::DecodeInto(bytes, &heartbeat_in_)) {
      return Refused(from, "a heartbeat datagram whose body is no HeartbeatRequest");
    }
    HandleHeartbeat(session, learner_id, heartbeat_in_, from);
  } else {
    if (!datagram::DecodeInto(bytes, &join_in_)) {
      return Refused(from, "a join datagram whose body is no DatagramJoin");
    }
    HandleJoin(session, learner_id, join_in_, from);
  }
}

void DatagramServer::Refused(const Address& from, std::string_view why) {
  counters_.dropped_malformed++;
  core_->RecordRejection("INVALID_ARGUMENT", AddressText(from.storage), why);
}

void DatagramServer::HandleHeartbeat(uint64_t session_id, const std::string& learner_id,
                                     const v1::HeartbeatRequest& body, const Address& from) {
  // The session says who: whatever the body says of the learner is not read.
  auto result = handler_.HeartbeatOf(learner_id, session_id, body);
  if (!result.ok() && result.status().code() == StatusCode::kInvalidArgument) {
    return Refused(from, StatusMessage(result.status()));
  }
  MutexLock lock(mu_);
  auto it = peers_.find(session_id);
  if (it == peers_.end()) return;
  Peer& peer = it->second;
  if (!result.ok()) {
    const StatusCode code = result.status().code();
    if (wire::NeedsRegistration(code) || wire::Superseded(code)) {
      Outgoing reply;
      reply.session_id = session_id;
      reply.address = from;
      reply.kind = SessionEndedKind(code);
      Enqueue(std::move(reply));
      peers_.erase(it);
    }
    return;
  }
  auto ack = handler_.AckDue(peer.ack, *result);
  if (!ack) return;
  Outgoing reply;
  reply.session_id = session_id;
  reply.address = peer.address;
  reply.kind = datagram::Kind::kAck;
  reply.ack = ack->SerializeAsString();
  Enqueue(std::move(reply));
}

void DatagramServer::HandleJoin(uint64_t session_id, const std::string& learner_id,
                                v1::DatagramJoin& body, const Address& from) {
  const uint64_t join_id = body.join_id();
  {
    MutexLock lock(mu_);
    Peer& peer = peers_[session_id];
    if (join_id == peer.pending_join) return;  // a resend; still waiting
    if (join_id == peer.decided_join) {        // a resend; the decision was lost
      Outgoing reply;
      reply.session_id = session_id;
      reply.address = peer.address;
      reply.kind = datagram::Kind::kDecision;
      reply.join_id = join_id;
      reply.decision = peer.decision;
      Enqueue(std::move(reply));
      return;
    }
    peer.pending_join = join_id;
  }
  v1::QuorumRequest& request = *body.mutable_request();
  request.mutable_learner()->set_learner_id(learner_id);
  request.mutable_learner()->set_session_id(session_id);
  auto waiting =
      handler_.Quorum(request, [this, session_id, join_id, from](StatusOr<RoundAssignment> result) {
        OnDecision(session_id, join_id, from, std::move(result));
      });
  if (!waiting.ok()) {  // refused: the learner gets the reason, not a silence
    Refused(from, StatusMessage(waiting.status()));
    OnDecision(session_id, join_id, from, waiting.status());
  }
}

void DatagramServer::OnDecision(uint64_t session_id, uint64_t join_id, const Address& to,
                                StatusOr<RoundAssignment> result) {
  // Runs once per member, on the thread that closed the round: queue only.
  // The sender records the decision for resends after sending it.
  Outgoing reply;
  reply.session_id = session_id;
  reply.address = to;
  reply.kind = datagram::Kind::kDecision;
  reply.join_id = join_id;
  reply.decision = std::move(result);
  Enqueue(std::move(reply));
}

void DatagramServer::RememberDecisions(const std::vector<Outgoing>& batch) {
  MutexLock lock(mu_);
  for (const Outgoing& sent : batch) {
    if (sent.kind != datagram::Kind::kDecision) continue;
    auto it = peers_.find(sent.session_id);
    if (it == peers_.end()) continue;
    Peer& peer = it->second;
    if (peer.pending_join == sent.join_id) peer.pending_join = 0;
    if (sent.join_id >= peer.decided_join) {
      peer.decided_join = sent.join_id;
      peer.decision = sent.decision;
    }
  }
}

void DatagramServer::Enqueue(Outgoing outgoing) {
  // Growing needs no wakeup: only the receiving thread waits, for it to shrink.
  backlog_.fetch_add(1, std::memory_order_relaxed);
  Sender& sender = *senders_[outgoing.session_id % senders_.size()];
  MutexLock lock(sender.mu);
  sender.queue.push_back(std::move(outgoing));
  if (sender.queue.size() == 1) sender.ready.NotifyOne();
}

void DatagramServer::RunSender(Sender& sender) {
  datagram::Signer signer(key_);
  std::vector<Outgoing> taken;
  std::vector<Outgoing> batch;
  while (true) {
    {
      // Take everything queued: one lock per burst, not per datagram, keeps
      // the sender from contending with the thread that is still queueing.
      MutexLock lock(sender.mu);
      while (sender.queue.empty() && !sender.stopping) sender.ready.Wait(sender.mu);
      if (sender.queue.empty()) return;  // stopping, nothing left
      taken.swap(sender.queue);
    }
    for (size_t start = 0; start < taken.size(); start += kSendBatch) {
      size_t end = std::min(taken.size(), start + kSendBatch);
      batch.assign(std::make_move_iterator(taken.begin() + static_cast<long>(start)),
                   std::make_move_iterator(taken.begin() + static_cast<long>(end)));
      Send(batch, signer);
      RememberDecisions(batch);
      if (backlog_.fetch_sub(batch.size(), std::memory_order_relaxed) - batch.size() <=
          kYieldBacklog) {
        // Under the mutex: the receiving thread is either before its check
        // (and sees the new count) or waiting (and is woken).
        MutexLock lock(backlog_mu_);
        backlog_drained_.NotifyAll();
      }
    }
    taken.clear();
  }
}

void DatagramServer::Send(std::vector<Outgoing>& batch, datagram::Signer& signer) {
  uint64_t first_seq = next_seq_.fetch_add(batch.size());
  std::vector<std::string> encoded(batch.size());
  v1::DatagramDecision decision;  // reused: its strings keep their storage
  std::vector<mmsghdr> messages(batch.size());
  std::vector<iovec> vectors(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    datagram::Header header{batch[i].kind, batch[i].session_id, first_seq + i};
    switch (batch[i].kind) {
      case datagram::Kind::kAck:
        encoded[i] = datagram::Encode(header, batch[i].ack, signer);
        break;
      case datagram::Kind::kDecision:
        FillDatagramDecision(batch[i].join_id, batch[i].decision, datagram::kMaxBodyBytes,
                             &decision);
        encoded[i] = datagram::EncodeMessage(header, decision, signer);
        break;
      default:
        encoded[i] = datagram::Encode(header, {}, signer);
        break;
    }
    vectors[i] = {encoded[i].data(), encoded[i].size()};
    messages[i] = {};
    messages[i].msg_hdr.msg_iov = &vectors[i];
    messages[i].msg_hdr.msg_iovlen = 1;
    messages[i].msg_hdr.msg_name = &batch[i].address.storage;
    messages[i].msg_hdr.msg_namelen = batch[i].address.length;
  }
  for (size_t start = 0; start < batch.size();) {
    int sent =
        sendmmsg(socket_, messages.data() + start, static_cast<unsigned>(batch.size() - start), 0);
    if (sent < 0) {
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && !stopping_.load()) {
        pollfd out{socket_, POLLOUT, 0};
        poll(&out, 1, 100);  // the socket buffer drains as the kernel delivers
        continue;
      }
      // Unreachable peer or the like: skip this datagram, keep the rest.
      spdlog::debug("datagram send: {}", std::strerror(errno));
      sent = 1;
    }
    counters_.sent += static_cast<uint64_t>(sent);
    start += static_cast<size_t>(sent);
  }
}

}  // namespace mend::coordinator

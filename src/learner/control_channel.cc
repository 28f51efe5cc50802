#include "learner/control_channel.h"

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"

namespace mend {
namespace {

class GrpcControlChannel final : public ControlChannel {
 public:
  GrpcControlChannel(LighthouseClient& client, const Clock& clock,
                     std::function<void(const HeartbeatAck&)> on_ack)
      : client_(client), clock_(clock), on_ack_(std::move(on_ack)) {}

  ~GrpcControlChannel() override { Restart(); }

  void Attach(const LearnerRef& session) override {
    std::unique_ptr<HeartbeatStream> old;
    {
      MutexLock lock(mu_);
      session_ = session;
      old = std::move(stream_);
    }
  }

  Status SendHeartbeat(const v1::HeartbeatRequest& update) override {
    std::unique_ptr<HeartbeatStream> ended;
    {
      MutexLock lock(mu_);
      if (!stream_ || !stream_->done()) {
        if (!stream_) stream_ = client_.OpenHeartbeat(session_, clock_, on_ack_);
        stream_->Send(update);
        return OkStatus();
      }
      ended = std::move(stream_);
    }
    return ended->status();  // (the stream is closed outside the lock)
  }

  Micros last_ack_at() const override {
    MutexLock lock(mu_);
    return stream_ ? stream_->last_ack_at() : clock_.NowMicros();
  }

  void Restart() override {
    std::unique_ptr<HeartbeatStream> old;
    {
      MutexLock lock(mu_);
      old = std::move(stream_);
    }
  }

  StatusOr<QuorumResult> Join(const v1::QuorumRequest& request) override {
    auto call = std::make_shared<PendingCall>();
    {
      MutexLock lock(mu_);
      if (interrupted_) return AbortedError("learner agent is stopping");
      current_call_ = call;
    }
    client_.QuorumAsync(request, call->cancel, [call](StatusOr<QuorumResult> result) {
      MutexLock lock(call->mu);
      call->result = std::move(result);
      call->done.NotifyAll();
    });
    // An Interrupt() cancels the call; it is waited for even then, so that
    // no call is left in flight to complete while the learner shuts down.
    StatusOr<QuorumResult> result = AbortedError("learner agent is stopping");
    {
      MutexLock lock(call->mu);
      while (!call->result) call->done.Wait(call->mu);
      if (!call->interrupted) result = std::move(*call->result);
    }
    MutexLock lock(mu_);
    current_call_.reset();
    return result;
  }

  void Interrupt() override {
    std::shared_ptr<PendingCall> call;
    {
      MutexLock lock(mu_);
      interrupted_ = true;
      call = current_call_;
    }
    if (call) {
      {
        MutexLock lock(call->mu);
        call->interrupted = true;
      }
      call->cancel.Cancel();
    }
  }

 private:
  // A Quorum call in flight; shared with its completion callback.
  struct PendingCall {
    CallCanceller cancel;
    Mutex mu;
    CondVar done;
    std::optional<StatusOr<QuorumResult>> result ABSL_GUARDED_BY(mu);
    bool interrupted ABSL_GUARDED_BY(mu) = false;
  };

  LighthouseClient& client_;
  const Clock& clock_;
  const std::function<void(const HeartbeatAck&)> on_ack_;

  mutable Mutex mu_;
  LearnerRef session_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HeartbeatStream> stream_ ABSL_GUARDED_BY(mu_);
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<PendingCall> current_call_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ControlChannel> NewGrpcControlChannel(
    LighthouseClient& client, const Clock& clock, std::function<void(const HeartbeatAck&)> on_ack) {
  return std::make_unique<GrpcControlChannel>(client, clock, std::move(on_ack));
}

}  // namespace mend

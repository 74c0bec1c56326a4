// ModelStreamInfer: the bidirectional streaming state machine (see grpc_calls.h).
#include <spdlog/spdlog.h>

#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <utility>

#include "core/mutex.h"
#include "server/grpc_calls.h"
#include "server/grpc_codec.h"
#include "server/request_log.h"

namespace shoal::server::internal {
namespace {

enum Event { kRequest = 0, kRead = 1, kWrite = 2, kFinish = 3, kDone = 4 };

using Response = inference::ModelStreamInferResponse;

// An error answer: error_message, with the request's id and model echoed in
// infer_response so that a client with several requests in flight can tell which one
// failed (clients that only look at error_message are unaffected).
std::unique_ptr<Response> ErrorResponse(const std::string& message, const std::string& id,
                                        const std::string& model, const std::string& version) {
  auto r = std::make_unique<Response>();
  r->set_error_message(message.empty() ? "unknown error" : message);
  auto* ir = r->mutable_infer_response();
  ir->set_id(id);
  ir->set_model_name(model);
  ir->set_model_version(version);
  return r;
}

class StreamInferCall final : public Call {
 public:
  static void Arm(CallContext* ctx, grpc::ServerCompletionQueue* cq) {
    auto* call = new StreamInferCall(ctx, cq);
    call->server_ctx_.AsyncNotifyWhenDone(&call->done_tag_);
    ctx->service->RequestModelStreamInfer(&call->server_ctx_, &call->stream_, cq, cq,
                                          &call->request_tag_);
  }

  void OnEvent(int event, bool ok) override {
    switch (event) {
      case kRequest:
        if (!ok) {  // never started: no done notification will come
          Unref();
          return;
        }
        Ref();  // the done notification
        MarkStarted();
        Arm(ctx_, cq_);
        {
          // Registered and checked under one lock, so Stop either sees this stream or
          // this stream sees `draining`.
          MutexLock ctx_lock(&ctx_->mu);
          ctx_->streams.insert(this);
          MutexLock lock(&mu_);
          draining_ = ctx_->draining.load();
          if (grpc::Status denied = Authorize(*ctx_, server_ctx_, EndpointClass::kInference);
              !denied.ok()) {
            // Refused before reading anything: the stream ends with the status.
            finishing_ = true;
            Ref();  // the finish
            stream_.Finish(denied, &finish_tag_);
          } else if (draining_) {
            MaybeFinishLocked();
          } else {
            StartReadLocked();
          }
        }
        Unref();  // the request
        return;
      case kRead:
        if (ok) {
          OnRead();
        } else {  // the client half-closed, or the call is gone
          MutexLock lock(&mu_);
          reads_done_ = true;
          MaybeFinishLocked();
        }
        Unref();  // the read
        return;
      case kWrite: {
        MutexLock lock(&mu_);
        writing_ = false;
        queue_.pop_front();
        if (!ok) {
          // The call is broken (client gone): nothing more can be written.
          broken_ = true;
          queue_.clear();
        }
        WriteNextLocked();
        ResumeReadingLocked();
        MaybeFinishLocked();
      }
        Unref();  // the write
        return;
      case kFinish:
        Unref();
        return;
      case kDone:
        OnDone();
        Unref();
        return;
    }
  }

  // With ctx_->mu held (by GrpcServer::Stop). The call cannot be mid-deletion here
  // with work left to start: its last reference goes only after its Finish completed,
  // so MaybeFinishLocked then does nothing.
  void Drain() override {
    ctx_->mu.AssertHeld();
    MutexLock lock(&mu_);
    draining_ = true;
    MaybeFinishLocked();
  }

  ~StreamInferCall() override {
    MutexLock lock(&ctx_->mu);
    ctx_->streams.erase(this);
  }

 private:
  StreamInferCall(CallContext* ctx, grpc::ServerCompletionQueue* cq) : Call(ctx, cq) {}

  // One read in flight at a time, into a fresh message (earlier ones may still be viewed
  // by tensors in the runtime).
  void StartReadLocked() REQUIRES(mu_) {
    reading_ = std::make_shared<inference::ModelInferRequest>();
    Ref();  // the read
    stream_.Read(reading_.get(), &read_tag_);
  }

  // Reads the next request unless too many are unanswered (back-pressure: the client's
  // sends then wait in gRPC's flow control).
  void ContinueReadingLocked() REQUIRES(mu_) {
    if (in_flight_ + static_cast<int64_t>(queue_.size()) < ctx_->stream_max_in_flight) {
      StartReadLocked();
    } else {
      read_paused_ = true;
    }
  }

  void ResumeReadingLocked() REQUIRES(mu_) {
    if (read_paused_ &&
        in_flight_ + static_cast<int64_t>(queue_.size()) < ctx_->stream_max_in_flight) {
      read_paused_ = false;
      StartReadLocked();
    }
  }

  void OnRead() {
    std::shared_ptr<inference::ModelInferRequest> message;
    {
      MutexLock lock(&mu_);
      message = std::move(reading_);
    }
    const int64_t start_ns = RequestLogNowNs();
    StatusOr<runtime::InferRequest> decoded = Unavailable("the server is shutting down");
    SharedMemoryOutputs shm;
    if (!ctx_->draining.load()) {
      try {
        decoded = InferRequestFromProto(message, ctx_->limits,
                                        &ctx_->handlers->extension_state().shared_memory, &shm);
      } catch (const std::exception& e) {
        decoded = Internal(std::string("internal error: ") + e.what());
      }
    }
    if (!decoded.ok()) {
      LogRequest({"gRPC stream", message->model_name(), 0, message->id(), decoded.status(), 0, 0,
                  RequestLogNowNs() - start_ns});
      auto error = ErrorResponse(decoded.status().message(), message->id(), message->model_name(),
                                 message->model_version());
      MutexLock lock(&mu_);
      EnqueueLocked(std::move(error));
      ContinueReadingLocked();
      return;
    }
    uint64_t seq;
    {
      MutexLock lock(&mu_);
      seq = next_seq_++;
      ++in_flight_;
      handles_[seq] = nullptr;  // erased by the answer, which may come inside Infer
    }
    Ref();  // the runtime callback
    auto handle =
        ctx_->runtime->Infer(std::move(decoded).value(),
                             [this, seq, start_ns, shm = std::move(shm)](runtime::InferResponse r) {
                               OnAnswer(seq, start_ns, std::move(r), shm);
                             });
    bool cancel = false;
    {
      MutexLock lock(&mu_);
      if (auto it = handles_.find(seq); it != handles_.end()) {
        it->second = handle;
        cancel = cancelled_;
      }
      ContinueReadingLocked();
    }
    if (cancel) handle->Cancel();
  }

  // On a runtime thread (or inside Infer when answered at once).
  void OnAnswer(uint64_t seq, int64_t start_ns, runtime::InferResponse answer,
                const SharedMemoryOutputs& shm) {
    std::unique_ptr<Response> response;
    Status logged = answer.status;
    try {
      if (answer.status.ok()) {
        response = std::make_unique<Response>();
        auto* ir = response->mutable_infer_response();
        if (Status written = InferResponseToProto(answer, shm, ir); !written.ok()) {
          response = ErrorResponse(written.message(), answer.id, answer.model_name, "");
        } else {
          // One response per request (no decoupled models): each is the final one.
          (*ir->mutable_parameters())["triton_final_response"].set_bool_param(true);
        }
      } else {
        response = ErrorResponse(
            answer.status.message(), answer.id, answer.model_name,
            answer.model_version > 0 ? std::to_string(answer.model_version) : std::string());
      }
    } catch (const std::exception& e) {
      logged = Internal(std::string("internal error: ") + e.what());
      response = ErrorResponse(logged.message(), answer.id, answer.model_name, "");
    }
    LogRequest({"gRPC stream", answer.model_name, answer.model_version, answer.id, logged,
                answer.queue_ns, answer.compute_ns, RequestLogNowNs() - start_ns});
    answer = runtime::InferResponse();  // release output buffers before the send
    {
      MutexLock lock(&mu_);
      handles_.erase(seq);
      --in_flight_;
      EnqueueLocked(std::move(response));
      ResumeReadingLocked();
      MaybeFinishLocked();
    }
    Unref();  // the runtime callback
  }

  void EnqueueLocked(std::unique_ptr<Response> response) REQUIRES(mu_) {
    if (broken_) return;
    queue_.push_back(std::move(response));
    WriteNextLocked();
  }

  // One write in flight at a time; the message written is queue_.front().
  void WriteNextLocked() REQUIRES(mu_) {
    if (writing_ || queue_.empty()) return;
    writing_ = true;
    Ref();  // the write
    stream_.Write(*queue_.front(), &write_tag_);
  }

  // Finishes once nothing is in flight: with OK after the client half-closed, or with
  // UNAVAILABLE when the server is stopping (a read may then be pending; it fails).
  void MaybeFinishLocked() REQUIRES(mu_) {
    if (finishing_ || in_flight_ > 0 || writing_ || !queue_.empty()) return;
    if (!reads_done_ && !draining_) return;
    finishing_ = true;
    Ref();  // the finish
    stream_.Finish(
        reads_done_ ? grpc::Status::OK : ToGrpcStatus(Unavailable("the server is shutting down")),
        &finish_tag_);
  }

  void OnDone() {
    std::vector<std::shared_ptr<runtime::RequestHandle>> to_cancel;
    {
      MutexLock lock(&mu_);
      if (!server_ctx_.IsCancelled()) return;
      cancelled_ = true;
      for (const auto& [seq, handle] : handles_) {
        if (handle) to_cancel.push_back(handle);
      }
    }
    for (const auto& handle : to_cancel) handle->Cancel();
  }

  grpc::ServerContext server_ctx_;
  grpc::ServerAsyncReaderWriter<Response, inference::ModelInferRequest> stream_{&server_ctx_};
  Tag request_tag_{this, kRequest};
  Tag read_tag_{this, kRead};
  Tag write_tag_{this, kWrite};
  Tag finish_tag_{this, kFinish};
  Tag done_tag_{this, kDone};

  Mutex mu_;
  std::shared_ptr<inference::ModelInferRequest> reading_ GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Response>> queue_ GUARDED_BY(mu_);  // front is being written
  bool writing_ GUARDED_BY(mu_) = false;
  bool reads_done_ GUARDED_BY(mu_) = false;
  bool read_paused_ GUARDED_BY(mu_) = false;
  bool finishing_ GUARDED_BY(mu_) = false;
  bool draining_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;
  bool cancelled_ GUARDED_BY(mu_) = false;
  int64_t in_flight_ GUARDED_BY(mu_) = 0;  // runtime requests
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  // Unanswered runtime requests, for cancellation; null until Infer returns.
  std::map<uint64_t, std::shared_ptr<runtime::RequestHandle>> handles_ GUARDED_BY(mu_);
};

}  // namespace

void ArmStreamInferCall(CallContext* ctx, grpc::ServerCompletionQueue* cq) {
  StreamInferCall::Arm(ctx, cq);
}

}  // namespace shoal::server::internal

#include "server/grpc_calls.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <memory>
#include <utility>

#include "core/log_text.h"
#include "server/grpc_codec.h"
#include "server/request_log.h"

namespace shoal::server::internal {

Call::Call(CallContext* ctx, grpc::ServerCompletionQueue* cq) : ctx_(ctx), cq_(cq) {
  MutexLock lock(&ctx_->mu);
  ++ctx_->live_calls;
}

Call::~Call() {
  MutexLock lock(&ctx_->mu);
  --ctx_->live_calls;
  if (started_) --ctx_->active_calls;
  ctx_->cv.SignalAll();
}

void Call::MarkStarted() {
  MutexLock lock(&ctx_->mu);
  started_ = true;
  ++ctx_->active_calls;
}

void RunCompletionQueue(grpc::ServerCompletionQueue* cq) {
  void* raw = nullptr;
  bool ok = false;
  while (cq->Next(&raw, &ok)) {
    auto* tag = static_cast<Tag*>(raw);
    try {
      tag->call->OnEvent(tag->event, ok);
    } catch (const std::exception& e) {
      // Only allocation can throw here; the call's state is then unknown, so it is
      // leaked rather than touched again.
      spdlog::error("gRPC call event {} failed: {}", tag->event, LogSafe(e.what()));
    }
  }
}

grpc::Status Authorize(const CallContext& ctx, const grpc::ServerContext& server_ctx,
                       EndpointClass endpoint) {
  if (ctx.auth == nullptr || !ctx.auth->Requires(endpoint)) return grpc::Status::OK;
  const auto& metadata = server_ctx.client_metadata();
  const auto it = metadata.find("authorization");
  const std::string_view value =
      it != metadata.end() ? std::string_view(it->second.data(), it->second.size()) : "";
  const AuthResult auth = ctx.auth->Check(it != metadata.end() ? &value : nullptr);
  return auth.ok ? grpc::Status::OK : grpc::Status(grpc::StatusCode::UNAUTHENTICATED, auth.message);
}

namespace {

enum Event { kRequest = 0, kFinish = 1, kDone = 2 };

// The client's deadline as microseconds left (at least 1 when already passed), or 0 when
// it set none.
uint64_t DeadlineBudgetUs(const grpc::ServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return 0;
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
                        deadline - std::chrono::system_clock::now())
                        .count();
  // Years away is the same as none (and would overflow the server's clock).
  if (left > int64_t{1} << 40) return 0;
  return left < 1 ? 1 : static_cast<uint64_t>(left);
}

grpc::Status InternalError(const std::exception& e) {
  return grpc::Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
}

// ------------------------------------------------------------------ unary RPCs

template <typename Svc, typename Req, typename Resp>
class UnaryCall final : public Call {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<Resp>;
  using RequestFn = void (Svc::*)(grpc::ServerContext*, Req*, Writer*, grpc::CompletionQueue*,
                                  grpc::ServerCompletionQueue*, void*);
  struct Spec {
    Svc* service;
    RequestFn request;
    std::function<grpc::Status(const Req&, Resp*)> handler;
    EndpointClass endpoint;  // whether the RPC needs the bearer token
    bool blocking;           // run on the worker thread
  };

  static void Arm(CallContext* ctx, grpc::ServerCompletionQueue* cq,
                  std::shared_ptr<const Spec> spec) {
    auto* call = new UnaryCall(ctx, cq, std::move(spec));
    (call->spec_->service->*call->spec_->request)(&call->server_ctx_, &call->request_,
                                                  &call->writer_, cq, cq, &call->request_tag_);
  }

  void OnEvent(int event, bool ok) override {
    if (event == kFinish || !ok) {  // finished, or never started (shutdown)
      Unref();
      return;
    }
    MarkStarted();
    Arm(ctx_, cq_, spec_);
    if (grpc::Status denied = Authorize(*ctx_, server_ctx_, spec_->endpoint); !denied.ok()) {
      writer_.FinishWithError(denied, &finish_tag_);
      return;
    }
    if (spec_->blocking) {
      ctx_->run_blocking([this] { Respond(); });
    } else {
      Respond();
    }
  }

 private:
  UnaryCall(CallContext* ctx, grpc::ServerCompletionQueue* cq, std::shared_ptr<const Spec> spec)
      : Call(ctx, cq), spec_(std::move(spec)) {}

  void Respond() {
    grpc::Status status;
    try {
      status = spec_->handler(request_, &response_);
    } catch (const std::exception& e) {
      status = InternalError(e);
    }
    if (status.ok()) {
      writer_.Finish(response_, status, &finish_tag_);
    } else {
      writer_.FinishWithError(status, &finish_tag_);
    }
  }

  const std::shared_ptr<const Spec> spec_;
  grpc::ServerContext server_ctx_;
  Req request_;
  Resp response_;
  Writer writer_{&server_ctx_};
  Tag request_tag_{this, kRequest};
  Tag finish_tag_{this, kFinish};
};

// Arms the first call of one unary RPC answered by a GrpcHandlers method.
template <typename Svc, typename Req, typename Resp, typename RequestFn>
void ArmUnary(CallContext* ctx, grpc::ServerCompletionQueue* cq, Svc* service, RequestFn request,
              grpc::Status (GrpcHandlers::*method)(const Req&, Resp*), EndpointClass endpoint,
              bool blocking = false) {
  using C = UnaryCall<Svc, Req, Resp>;
  GrpcHandlers* handlers = ctx->handlers;
  auto spec = std::make_shared<const typename C::Spec>(typename C::Spec{
      service, request,
      [handlers, method](const Req& req, Resp* resp) { return (handlers->*method)(req, resp); },
      endpoint, blocking});
  C::Arm(ctx, cq, std::move(spec));
}

// ------------------------------------------------------------------ ModelInfer

class InferCall final : public Call {
 public:
  static void Arm(CallContext* ctx, grpc::ServerCompletionQueue* cq) {
    auto* call = new InferCall(ctx, cq);
    call->server_ctx_.AsyncNotifyWhenDone(&call->done_tag_);
    ctx->service->RequestModelInfer(&call->server_ctx_, call->request_.get(), &call->writer_, cq,
                                    cq, &call->request_tag_);
  }

  void OnEvent(int event, bool ok) override {
    switch (event) {
      case kRequest:
        if (!ok) {  // never started: no done notification will come
          Unref();
          return;
        }
        Ref();  // the done notification, which now will come
        MarkStarted();
        Arm(ctx_, cq_);
        Start();
        Unref();  // the request
        return;
      case kDone:
        OnDone();
        Unref();
        return;
      case kFinish:
        Unref();
        return;
    }
  }

 private:
  InferCall(CallContext* ctx, grpc::ServerCompletionQueue* cq)
      : Call(ctx, cq), request_(std::make_shared<inference::ModelInferRequest>()) {}

  void Start() {
    start_ns_ = RequestLogNowNs();
    if (ctx_->draining.load()) {
      LogRequest({"gRPC", request_->model_name(), 0, request_->id(),
                  Unavailable("the server is shutting down"), 0, 0, 0});
      Ref();  // the finish
      writer_.FinishWithError(ToGrpcStatus(Unavailable("the server is shutting down")),
                              &finish_tag_);
      return;
    }
    if (grpc::Status denied = Authorize(*ctx_, server_ctx_, EndpointClass::kInference);
        !denied.ok()) {
      Ref();  // the finish
      writer_.FinishWithError(denied, &finish_tag_);
      return;
    }
    StatusOr<runtime::InferRequest> decoded = Internal("not decoded");
    try {
      decoded = InferRequestFromProto(request_, ctx_->limits,
                                      &ctx_->handlers->extension_state().shared_memory,
                                      &shared_memory_outputs_);
    } catch (const std::exception& e) {
      decoded = Internal(std::string("internal error: ") + e.what());
    }
    if (!decoded.ok()) {
      LogRequest({"gRPC", request_->model_name(), 0, request_->id(), decoded.status(), 0, 0,
                  RequestLogNowNs() - start_ns_});
      Ref();  // the finish
      writer_.FinishWithError(ToGrpcStatus(decoded.status()), &finish_tag_);
      return;
    }
    decoded->client_deadline_us = DeadlineBudgetUs(server_ctx_);
    Ref();  // the runtime callback
    auto handle = ctx_->runtime->Infer(
        std::move(decoded).value(), [this](runtime::InferResponse r) { OnAnswer(std::move(r)); });
    bool cancel = false;
    {
      MutexLock lock(&mu_);
      handle_ = handle;
      cancel = cancelled_ && !answered_;
    }
    if (cancel) handle->Cancel();
  }

  // On a runtime thread (or inside Infer when answered at once).
  void OnAnswer(runtime::InferResponse answer) {
    {
      MutexLock lock(&mu_);
      answered_ = true;
    }
    grpc::Status status = ToGrpcStatus(answer.status);
    Status logged = answer.status;
    if (status.ok()) {
      try {
        status = ToGrpcStatus(InferResponseToProto(answer, shared_memory_outputs_, &response_));
      } catch (const std::exception& e) {
        status = InternalError(e);
        logged = Internal(status.error_message());
      }
    }
    LogRequest({"gRPC", request_->model_name(), answer.model_version, answer.id, logged,
                answer.queue_ns, answer.compute_ns, RequestLogNowNs() - start_ns_});
    // Release the runtime's output buffers before the (possibly slow) network send.
    answer = runtime::InferResponse();
    Ref();  // the finish
    if (status.ok()) {
      writer_.Finish(response_, status, &finish_tag_);
    } else {
      writer_.FinishWithError(status, &finish_tag_);
    }
    Unref();  // the runtime callback
  }

  void OnDone() {
    std::shared_ptr<runtime::RequestHandle> handle;
    {
      MutexLock lock(&mu_);
      if (server_ctx_.IsCancelled()) {
        cancelled_ = true;
        if (!answered_) handle = handle_;
      }
    }
    if (handle) handle->Cancel();
  }

  grpc::ServerContext server_ctx_;
  // Shared: the decoded tensors view its raw_input_contents and keep it alive.
  const std::shared_ptr<inference::ModelInferRequest> request_;
  inference::ModelInferResponse response_;
  SharedMemoryOutputs shared_memory_outputs_;  // set by Start, read by OnAnswer
  grpc::ServerAsyncResponseWriter<inference::ModelInferResponse> writer_{&server_ctx_};
  Tag request_tag_{this, kRequest};
  Tag finish_tag_{this, kFinish};
  Tag done_tag_{this, kDone};

  int64_t start_ns_ = 0;  // RequestLogNowNs() at Start, for the request log

  Mutex mu_;
  std::shared_ptr<runtime::RequestHandle> handle_ GUARDED_BY(mu_);
  bool answered_ GUARDED_BY(mu_) = false;
  bool cancelled_ GUARDED_BY(mu_) = false;
};

// ModelInfer calls kept armed per queue, so a burst of new calls finds one waiting.
constexpr int kArmedInferCalls = 4;

}  // namespace

void ArmCalls(CallContext* ctx, grpc::ServerCompletionQueue* cq) {
  using S = InferenceService;
  S* s = ctx->service;
  using E = EndpointClass;
  ArmUnary(ctx, cq, s, &S::RequestServerLive, &GrpcHandlers::ServerLive, E::kHealth);
  ArmUnary(ctx, cq, s, &S::RequestServerReady, &GrpcHandlers::ServerReady, E::kHealth);
  ArmUnary(ctx, cq, s, &S::RequestModelReady, &GrpcHandlers::ModelReady, E::kHealth);
  ArmUnary(ctx, cq, s, &S::RequestServerMetadata, &GrpcHandlers::ServerMetadata, E::kMetadata);
  ArmUnary(ctx, cq, s, &S::RequestModelMetadata, &GrpcHandlers::ModelMetadata, E::kMetadata);
  ArmUnary(ctx, cq, s, &S::RequestModelConfig, &GrpcHandlers::ModelConfig, E::kMetadata);
  ArmUnary(ctx, cq, s, &S::RequestModelStatistics, &GrpcHandlers::ModelStatistics, E::kMetadata);
  ArmUnary(ctx, cq, s, &S::RequestRepositoryIndex, &GrpcHandlers::RepositoryIndex, E::kControl);
  ArmUnary(ctx, cq, s, &S::RequestRepositoryModelLoad, &GrpcHandlers::RepositoryModelLoad,
           E::kControl, /*blocking=*/true);
  ArmUnary(ctx, cq, s, &S::RequestRepositoryModelUnload, &GrpcHandlers::RepositoryModelUnload,
           E::kControl, /*blocking=*/true);
  ArmUnary(ctx, cq, ctx->health, &HealthService::RequestCheck, &GrpcHandlers::HealthCheck,
           E::kHealth);

  // Shared memory is part of how a client sends inference; trace and log settings
  // change the server for everyone, as model control does.
  ArmUnary(ctx, cq, s, &S::RequestSystemSharedMemoryStatus, &GrpcHandlers::SystemSharedMemoryStatus,
           E::kInference);
  ArmUnary(ctx, cq, s, &S::RequestSystemSharedMemoryRegister,
           &GrpcHandlers::SystemSharedMemoryRegister, E::kInference);
  ArmUnary(ctx, cq, s, &S::RequestSystemSharedMemoryUnregister,
           &GrpcHandlers::SystemSharedMemoryUnregister, E::kInference);
  ArmUnary(ctx, cq, s, &S::RequestCudaSharedMemoryStatus, &GrpcHandlers::CudaSharedMemoryStatus,
           E::kInference);
  ArmUnary(ctx, cq, s, &S::RequestCudaSharedMemoryRegister, &GrpcHandlers::CudaSharedMemoryRegister,
           E::kInference);
  ArmUnary(ctx, cq, s, &S::RequestCudaSharedMemoryUnregister,
           &GrpcHandlers::CudaSharedMemoryUnregister, E::kInference);
  ArmUnary(ctx, cq, s, &S::RequestTraceSetting, &GrpcHandlers::TraceSetting, E::kControl);
  ArmUnary(ctx, cq, s, &S::RequestLogSettings, &GrpcHandlers::LogSettings, E::kControl);

  for (int i = 0; i < kArmedInferCalls; ++i) InferCall::Arm(ctx, cq);
  ArmStreamInferCall(ctx, cq);
}

}  // namespace shoal::server::internal

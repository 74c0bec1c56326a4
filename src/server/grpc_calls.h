// The per-RPC state machines of the gRPC front end, on gRPC's asynchronous API. Internal
// to GrpcServer (grpc_server.h); nothing outside src/server/grpc_* includes this.
//
// Model: every RPC in progress is one heap object derived from Call. A call is created
// "armed" (Request<Rpc> is pending on a completion queue) and, as soon as a client call
// is matched to it, arms its successor, so every RPC always has a call waiting on every
// queue. Each asynchronous operation carries a Tag naming the call and the event; the
// queue's thread hands the event to Call::OnEvent. Calls count their own references:
// one per operation in flight and per runtime callback not yet run; the last Unref
// deletes the call.
//
// States and transitions:
//   UnaryCall    ARMED -request-> HANDLING -Finish-> FINISHING -finish-> deleted
//                (a failed request, i.e. the server shutting down: ARMED -> deleted).
//                Blocking handlers (model load/unload) run on the worker thread.
//   InferCall    ARMED -request-> decode; runtime::Server::Infer -> WAITING
//                -callback (runtime thread)-> Finish -> FINISHING -finish+done-> deleted.
//                A decode error Finishes at once. The done notification of a cancelled
//                call (client gone, deadline, server shutdown grace expired) cancels
//                the runtime request.
//   While the server stops (CallContext::draining), a new inference call is answered
//   UNAVAILABLE at once.
//   StreamInferCall (grpc_stream.cc): ARMED -request-> READING: each message read is
//                decoded and sent to the runtime, and the next read starts (paused while
//                `stream_max_in_flight` requests are unanswered); each answer is queued
//                and written, one write at a time, in completion order (clients match
//                by id), each with parameter triton_final_response = true. Errors are written as
//                error_message (with the id echoed in infer_response) and the stream goes on. After
//                the client half-closes and every answer is written, Finish(OK). Draining: messages
//                read get an UNAVAILABLE error_message, and once nothing is in flight the stream
//                ends with Finish(UNAVAILABLE) without waiting for the half-close.
//
// Threads: completion-queue threads run OnEvent; runtime threads run infer callbacks
// (which build the response and start Finish/Write: never a blocking wait); the worker
// thread runs blocking handlers. A call's mutable state shared by these is under its
// own mutex; gRPC operations may be started from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <set>

#include "core/mutex.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/grpc_service.grpc.pb.h"
#include "runtime/server.h"
#include "server/auth.h"
#include "server/grpc_handlers.h"

namespace shoal::server::internal {

using InferenceService = inference::GRPCInferenceService::AsyncService;
using HealthService = grpc::health::v1::Health::AsyncService;

class Call;

// What every call of one GrpcServer shares. Outlives every call (GrpcServer::Stop waits
// for live_calls to reach zero before anything here is destroyed).
struct CallContext {
  runtime::Server* runtime = nullptr;
  InferenceService* service = nullptr;
  HealthService* health = nullptr;
  GrpcHandlers* handlers = nullptr;
  runtime::RequestLimits limits;
  int64_t stream_max_in_flight = 256;
  // When set, RPCs its scope covers need its bearer token in the "authorization"
  // metadata; checked when a call starts, before any handler runs.
  std::shared_ptr<const Authenticator> auth;
  // Runs `fn` on the worker thread (for handlers that block).
  std::function<void(std::function<void()>)> run_blocking;

  // Set once by GrpcServer::Stop: new inference calls (and new messages on open
  // streams) are answered UNAVAILABLE, and idle streams are finished.
  std::atomic<bool> draining{false};

  // Lock order: mu -> a call's own mutex.
  Mutex mu;
  CondVar cv;                               // live_calls or active_calls went down
  int64_t live_calls GUARDED_BY(mu) = 0;    // call objects, armed ones included
  int64_t active_calls GUARDED_BY(mu) = 0;  // calls matched to a client call
  // Started ModelStreamInfer calls, told to Drain when the server stops.
  std::set<Call*> streams GUARDED_BY(mu);
};

// The tag of one asynchronous operation.
struct Tag {
  Call* call;
  int event;
};

class Call {
 public:
  Call(CallContext* ctx, grpc::ServerCompletionQueue* cq);
  virtual ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Called on a completion-queue thread for each completed operation.
  virtual void OnEvent(int event, bool ok) = 0;
  // The server is stopping: finish as soon as no request is in flight. Called with
  // ctx->mu held, for the calls in ctx->streams only.
  virtual void Drain() {}

 protected:
  // A client call was matched to this call: GrpcServer::Stop gives it the grace period.
  void MarkStarted();

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  // Deletes the call on the last reference; the caller must not touch it afterwards.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  CallContext* const ctx_;
  grpc::ServerCompletionQueue* const cq_;

 private:
  std::atomic<int> refs_{1};  // the armed request
  bool started_ GUARDED_BY(ctx_->mu) = false;
};

// OK when a call of this class may go on; UNAUTHENTICATED when ctx.auth requires a
// token that the call's "authorization" metadata does not carry.
grpc::Status Authorize(const CallContext& ctx, const grpc::ServerContext& server_ctx,
                       EndpointClass endpoint);

// Arms the first call of every RPC on `cq` (after the server started).
void ArmCalls(CallContext* ctx, grpc::ServerCompletionQueue* cq);
// Arms one ModelStreamInfer call (grpc_stream.cc).
void ArmStreamInferCall(CallContext* ctx, grpc::ServerCompletionQueue* cq);

// Runs the events of `cq` until it is shut down and drained.
void RunCompletionQueue(grpc::ServerCompletionQueue* cq);

}  // namespace shoal::server::internal

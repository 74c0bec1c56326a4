// The gRPC endpoint: blocking control calls on a stub, and GrpcTransport, which keeps
// its requests in flight as async unary ModelInfer calls on one completion queue that
// the caller's thread polls. Requests carry raw_input_contents, built once.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>
#include <thread>

#include "loadgen/endpoint.h"
#include "proto/grpc_service.grpc.pb.h"

namespace shoal::loadgen {
namespace {

constexpr int kControlTimeoutMs = 10'000;
// Calls in flight per channel (HTTP/2 connection); servers commonly allow 100 streams.
constexpr int64_t kCallsPerChannel = 64;
constexpr int64_t kMaxChannels = 16;

const char* GrpcCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "?";
}

std::shared_ptr<grpc::Channel> NewChannel(const HostPort& address, int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Separate TCP connections for separate channels.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Retries keep a copy of every request's send ops; a load generator never retries.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt("shoal.bench.channel", index);
  const std::string target = address.host.find(':') != std::string::npos
                                 ? fmt::format("[{}]:{}", address.host, address.port)
                                 : fmt::format("{}:{}", address.host, address.port);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(kControlTimeoutMs));
}

std::string VersionString(int64_t version) {
  return version >= 0 ? std::to_string(version) : std::string();
}

void AddDuration(const inference::StatisticDuration& d, DurationStat* out) {
  out->count += d.count();
  out->ns += d.ns();
}

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(const Clock& clock, const HostPort& address,
                std::vector<inference::ModelInferRequest> requests, int64_t capacity)
      : clock_(clock), requests_(std::move(requests)), calls_(static_cast<size_t>(capacity)) {
    const int64_t channels =
        std::clamp<int64_t>((capacity + kCallsPerChannel - 1) / kCallsPerChannel, 1, kMaxChannels);
    for (int64_t i = 0; i < channels; ++i) {
      stubs_.push_back(
          inference::GRPCInferenceService::NewStub(NewChannel(address, static_cast<int>(i))));
    }
    for (int64_t i = capacity - 1; i >= 0; --i) free_.push_back(&calls_[static_cast<size_t>(i)]);
    for (size_t i = 0; i < calls_.size(); ++i) calls_[i].stub = i % stubs_.size();
  }
  ~GrpcTransport() override {
    // Cancel what is in flight and drain the queue before the calls go away.
    for (Call& c : calls_) {
      if (c.in_flight) c.ctx->TryCancel();
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  int64_t capacity() const override { return static_cast<int64_t>(calls_.size()); }

  Status Start(uint64_t tag, size_t payload) override {
    if (free_.empty()) return FailedPrecondition("every gRPC call slot is busy");
    Call* c = free_.back();
    free_.pop_back();
    c->tag = tag;
    c->in_flight = true;
    c->ctx.emplace();
    c->response.Clear();
    c->rpc = stubs_[c->stub]->PrepareAsyncModelInfer(&*c->ctx,
                                                     requests_[payload % requests_.size()], &cq_);
    c->rpc->StartCall();
    c->rpc->Finish(&c->response, &c->status, c);
    return Status::Ok();
  }

  void Wait(int64_t deadline_ns, std::vector<Completion>* done) override {
    void* tag = nullptr;
    bool ok = false;
    while (true) {
      // gRPC's completion queue wakes from a timed wait milliseconds late (its timers are
      // coarse), which put every open-loop send behind schedule even at 50 requests/s. So it
      // blocks only until kPollAheadNs before the deadline; the rest of the wait polls it
      // between short sleeps, which wake on time.
      const int64_t left = deadline_ns - clock_.NowNs();
      std::chrono::system_clock::time_point until{};  // the past: poll without blocking
      if (left > kPollAheadNs) {
        until = std::chrono::system_clock::now() + std::chrono::nanoseconds(left - kPollAheadNs);
      }
      const auto r = cq_.AsyncNext(&tag, &ok, until);
      if (r == grpc::CompletionQueue::SHUTDOWN) return;
      if (r == grpc::CompletionQueue::GOT_EVENT) break;
      const int64_t now_left = deadline_ns - clock_.NowNs();
      if (now_left <= 0) return;
      if (now_left <= kPollAheadNs) {
        std::this_thread::sleep_for(
            std::chrono::nanoseconds(std::min<int64_t>(now_left, kPollSliceNs)));
      }
    }
    // Collect whatever else is ready without blocking.
    do {
      Finished(static_cast<Call*>(tag), done);
    } while (cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::time_point{}) ==
             grpc::CompletionQueue::GOT_EVENT);
  }

  std::string CodeName(int code) const override {
    return fmt::format("gRPC {}", GrpcCodeName(code));
  }

 private:
  struct Call {
    uint64_t tag = 0;
    size_t stub = 0;
    bool in_flight = false;
    std::optional<grpc::ClientContext> ctx;  // one per call, as gRPC requires
    inference::ModelInferResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> rpc;
  };

  static constexpr int64_t kPollAheadNs = 2'000'000;
  static constexpr int64_t kPollSliceNs = 50'000;

  void Finished(Call* c, std::vector<Completion>* done) {
    const int code = static_cast<int>(c->status.error_code());
    done->push_back(Completion{c->tag, clock_.NowNs(), c->status.ok(), code});
    c->in_flight = false;
    c->rpc.reset();
    free_.push_back(c);
  }

  const Clock& clock_;
  std::vector<inference::ModelInferRequest> requests_;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> stubs_;
  grpc::CompletionQueue cq_;
  std::vector<Call> calls_;
  std::vector<Call*> free_;
};

class GrpcEndpoint final : public Endpoint {
 public:
  explicit GrpcEndpoint(const HostPort& address)
      : address_(address),
        stub_(inference::GRPCInferenceService::NewStub(NewChannel(address, -1))) {}

  StatusOr<ModelInfo> GetModelInfo(const std::string& model, int64_t version) override {
    inference::ModelMetadataResponse meta;
    grpc::Status s = CallForModel(&Stub::ModelMetadata, model, version, &meta);
    if (!s.ok()) return ErrorFor(fmt::format("model '{}'", model), s);
    ModelInfo info;
    info.name = meta.name();
    for (const auto& t : meta.inputs()) {
      info.inputs.push_back({t.name(), t.datatype(), {t.shape().begin(), t.shape().end()}});
    }
    for (const auto& t : meta.outputs()) {
      info.outputs.push_back({t.name(), t.datatype(), {t.shape().begin(), t.shape().end()}});
    }
    if (info.inputs.empty()) return InvalidArgument(fmt::format("model '{}' has no inputs", model));
    inference::ModelConfigResponse config;
    if (CallForModel(&Stub::ModelConfig, model, version, &config).ok()) {
      info.max_batch_size = config.config().max_batch_size();
    }
    return info;
  }

  StatusOr<ServerStats> GetStats(const std::string& model, int64_t version) override {
    inference::ModelStatisticsResponse resp;
    grpc::Status s = CallForModel(&Stub::ModelStatistics, model, version, &resp);
    if (!s.ok()) return ErrorFor("statistics", s);
    ServerStats out;
    for (const auto& m : resp.model_stats()) {
      out.inference_count += m.inference_count();
      out.execution_count += m.execution_count();
      const auto& is = m.inference_stats();
      AddDuration(is.success(), &out.success);
      AddDuration(is.queue(), &out.queue);
      AddDuration(is.compute_input(), &out.compute_input);
      AddDuration(is.compute_infer(), &out.compute_infer);
      AddDuration(is.compute_output(), &out.compute_output);
    }
    return out;
  }

  StatusOr<std::unique_ptr<Transport>> NewTransport(const Clock& clock, const std::string& model,
                                                    int64_t version,
                                                    const std::vector<Payload>& payloads,
                                                    int64_t capacity) override {
    if (payloads.empty()) return InvalidArgument("no input payloads");
    std::vector<inference::ModelInferRequest> requests;
    for (const Payload& p : payloads) {
      inference::ModelInferRequest r;
      r.set_model_name(model);
      r.set_model_version(VersionString(version));
      for (const InputTensor& in : p) {
        auto* t = r.add_inputs();
        t->set_name(in.name);
        t->set_datatype(in.datatype);
        for (int64_t d : in.shape) t->add_shape(d);
        r.add_raw_input_contents(in.data);
      }
      requests.push_back(std::move(r));
    }
    return std::unique_ptr<Transport>(
        new GrpcTransport(clock, address_, std::move(requests), capacity));
  }

 private:
  Status ErrorFor(const std::string& what, const grpc::Status& s) {
    const std::string text = fmt::format("{}: {} (gRPC {})", what, s.error_message(),
                                         GrpcCodeName(static_cast<int>(s.error_code())));
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Unavailable(fmt::format("cannot reach {}:{}: {}", address_.host, address_.port, text));
    }
    return NotFound(text);
  }

  using Stub = inference::GRPCInferenceService::Stub;

  // A control call `rpc` naming the model and version (empty for the latest), under the
  // control deadline.
  template <typename Request, typename Response>
  grpc::Status CallForModel(grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                      Response*),
                            const std::string& model, int64_t version, Response* response) {
    Request request;
    request.set_name(model);
    request.set_version(VersionString(version));
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return (stub_.get()->*rpc)(&ctx, request, response);
  }

  HostPort address_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace

StatusOr<std::unique_ptr<Endpoint>> NewGrpcEndpoint(const HostPort& address) {
  return std::unique_ptr<Endpoint>(new GrpcEndpoint(address));
}

}  // namespace shoal::loadgen

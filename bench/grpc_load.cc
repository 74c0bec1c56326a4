// grpc_load: a closed-loop gRPC ModelInfer load generator for the front-end benchmark.
// Keeps --concurrency unary calls in flight on one completion queue (one client thread),
// with raw_input_contents, for --seconds after a one-second warm-up, and prints
// requests/s and latency percentiles as one Markdown table row.
//
//   grpc_load --target 127.0.0.1:8001 --model identity --elements 16 --concurrency 64 --seconds 10
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "proto/grpc_service.grpc.pb.h"

int main(int argc, char** argv) {
  std::string target = "127.0.0.1:8001", model = "identity";
  int elements = 16, concurrency = 64;
  double seconds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--target")
      target = argv[i + 1];
    else if (a == "--model")
      model = argv[i + 1];
    else if (a == "--elements")
      elements = std::atoi(argv[i + 1]);
    else if (a == "--concurrency")
      concurrency = std::atoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  auto stub = inference::GRPCInferenceService::NewStub(channel);

  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* in = request.add_inputs();
  in->set_name("INPUT0");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(elements);
  request.add_raw_input_contents(std::string(static_cast<size_t>(elements) * 4, '\0'));

  struct Call {
    grpc::ClientContext ctx;
    inference::ModelInferResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> rpc;
    std::chrono::steady_clock::time_point start;
  };
  grpc::CompletionQueue cq;
  auto issue = [&] {
    auto* call = new Call();
    call->start = std::chrono::steady_clock::now();
    call->rpc = stub->PrepareAsyncModelInfer(&call->ctx, request, &cq);
    call->rpc->StartCall();
    call->rpc->Finish(&call->response, &call->status, call);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const auto measure_from = t0 + std::chrono::seconds(1);
  const auto end = measure_from + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(seconds));
  for (int i = 0; i < concurrency; ++i) issue();
  std::vector<double> latencies_us;
  int64_t errors = 0, in_flight = concurrency;
  void* tag;
  bool ok;
  while (in_flight > 0 && cq.Next(&tag, &ok)) {
    auto* call = static_cast<Call*>(tag);
    const auto now = std::chrono::steady_clock::now();
    if (!call->status.ok()) {
      if (++errors <= 3)
        std::fprintf(stderr, "grpc_load: %s\n", call->status.error_message().c_str());
    } else if (now >= measure_from && now < end) {
      latencies_us.push_back(std::chrono::duration<double, std::micro>(now - call->start).count());
    }
    delete call;
    --in_flight;
    if (now < end) {
      issue();
      ++in_flight;
    }
  }
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    return latencies_us.empty() ? 0.0
                                : latencies_us[static_cast<size_t>(p * (latencies_us.size() - 1))];
  };
  std::printf("%.0f %.1f %.1f %lld\n", static_cast<double>(latencies_us.size()) / seconds, pct(0.5),
              pct(0.99), static_cast<long long>(errors));
  return errors > 0 ? 1 : 0;
}

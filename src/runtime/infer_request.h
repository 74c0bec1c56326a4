// InferRequest / InferResponse: what a front end hands the runtime and gets back.
//
// A front end builds an InferRequest (tensors owned, or views into the body it
// received), calls Server::Infer with a callback, and gets exactly one InferResponse
// through that callback: success, error, timeout, rejection, cancellation or shutdown.
// The callback runs on a runtime thread (the caller's own thread when the request is
// answered before it is queued); it must be quick and must not call back into the
// same model synchronously in a way that waits for an answer. An ensemble's step
// requests (ensemble_step) submitted from an instance's answer loop are dispatched after
// that loop (ModelVersion::DeferDispatch); other requests are dispatched at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal::runtime {

using ParameterValue = std::variant<bool, int64_t, double, std::string>;
using Parameters = std::map<std::string, ParameterValue>;

struct InferRequest {
  std::string model_name;
  int64_t model_version = -1;  // -1: the latest ready version
  std::string id;              // echoed in the response
  std::vector<NamedTensor> inputs;
  std::vector<std::string> requested_outputs;  // empty: all outputs
  uint32_t priority = 0;                       // 0: the model's default level; 1 is the highest
  // The KServe `timeout` parameter (microseconds): the request's deadline, counted from
  // its arrival, and its queue timeout where the model allows the override. 0 = none.
  uint64_t timeout_us = 0;
  // The client's own deadline as a budget from arrival (gRPC deadline, Shoal-Timeout-Us
  // header), microseconds; 0 = none. The earlier of this and timeout_us wins.
  uint64_t client_deadline_us = 0;
  // Absolute, on the server's clock; 0 = none. Set by the model version from the two
  // budgets above, or else from the model's latency SLO; a caller may set it directly.
  int64_t deadline_ns = 0;
  // Offline work (`shoal run`): no deadline, not even the model's SLO, and no admission
  // by predicted wait (a full queue is still refused).
  bool best_effort = false;
  // Submitted by an ensemble's DAG (Ensemble::Submit): when submitted from an instance's
  // answer loop, dispatched once every answer of that batch is given, so the batch
  // reaches this model together. No caller waits for such a request inside a callback.
  bool ensemble_step = false;
  // Request parameters other than priority/timeout; they enter the cache key.
  Parameters parameters;
  // Triton's classification extension: output name -> K. Those outputs are answered as
  // their top K classes (runtime/classification.h) instead of raw scores. Applied after
  // the model and the cache ran, so it is not part of the cache key.
  std::map<std::string, int64_t> classification;
};

struct InferResponse {
  std::string model_name;
  int64_t model_version = 0;
  std::string id;
  Status status;
  std::vector<NamedTensor> outputs;
  bool cache_hit = false;
  // Where the request's time went, for the request log: ns queued before its batch ran,
  // and ns of its batch's execution (merging inputs, the backend, scattering outputs).
  // 0 for requests that were answered without running (cache hits, rejections).
  int64_t queue_ns = 0;
  int64_t compute_ns = 0;
  // Response parameters for the client: `precision`, the tier that answered, when the
  // model has a precision ladder or the request chose a tier.
  Parameters parameters;
};

using InferCallback = std::function<void(InferResponse)>;

// Lets the caller cancel a request it submitted (a client that disconnected). Safe to
// call from any thread, any number of times, before or after the answer.
class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  virtual void Cancel() = 0;
};

}  // namespace shoal::runtime

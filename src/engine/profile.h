// Where a model's inference time goes, operator by operator (`shoal inspect --profile`).
//
// ProfileOperators runs the model `runs` times (after one untimed run that prepares the
// plan) in a Session of its own and times every step of the plan: Session::RunObserved
// shows the observer each step's output right after the step has run, so the time
// between two observations is that step's. Times are grouped by the operator type of the
// optimised graph (shoal.FusedConv, shoal.FusedMatMul, Transpose, ...). Views (Reshape and the
// like) are steps too and cost next to nothing. What no step accounts for (binding the inputs,
// copying the outputs out) is reported apart.
//
// The observer makes the stream wait after each step; oneDNN's CPU stream runs a step
// to its end before the next anyway, so a profiled run costs about what a plain one does.
// Call from one thread (the Session's rule).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/model.h"

namespace shoal::engine {

struct OperatorTime {
  std::string op_type;    // as in the optimised graph, with its domain ("shoal.FusedConv")
  int nodes = 0;          // nodes of this type that ran
  double ms_per_run = 0;  // their time together, averaged over the runs
};

struct OperatorProfile {
  std::vector<OperatorTime> operators;  // most time first
  double ms_per_run = 0;                // a whole run, averaged over the runs
  double outside_ms_per_run = 0;        // ms_per_run minus the operators' sum, >= 0
  int runs = 0;
  int threads = 0;  // the threads the plan ran on
  // Over the timed runs: how often data-dependent steps were prepared, and how often
  // a cached preparation was reused instead (Session::dynamic_stats; plan.h).
  DynamicPrepareStats dynamic;
  // Per node of the optimised graph (Model::graph()), averaged over the runs; 0 for a
  // node that never ran (computed when the plan was prepared). Pipeline stages are
  // balanced on these (pipeline_split.h).
  std::vector<double> node_ms;
};

// INVALID_ARGUMENT when `runs` < 1; otherwise Session::Create's and Run's errors.
StatusOr<OperatorProfile> ProfileOperators(const Model& model,
                                           const std::vector<NamedTensor>& inputs, int runs,
                                           const SessionOptions& options = {});

// As above, reading the time from `now_ms` (milliseconds from any origin) instead of the
// steady clock: read once as a run starts, once per observation, once as it ends. Tests
// give it a clock of their own.
StatusOr<OperatorProfile> ProfileOperators(const Model& model,
                                           const std::vector<NamedTensor>& inputs, int runs,
                                           const SessionOptions& options,
                                           const std::function<double()>& now_ms);

}  // namespace shoal::engine

// A test model that holds a lone request in its queue for ten minutes: it waits for a batch
// of 8 that never comes (batching_policy "fixed_window": Triton's window, which a lone
// request waits out; the default policy would run it at once). Only a cancellation, a full queue's
// refusal, a queue timeout or a draining shutdown (which runs what is queued) moves a request sent
// to it, so tests that use it assume nothing about how long anything takes. Used by the front ends'
// unit tests and by the end-to-end tests (backend "cost_model", one instance, INPUT0/OUTPUT0 FP32
// [1]).
//
//   repo.AddModel("held_q1", HeldConfig("held_q1", "default_queue_policy { max_queue_size: 1 }"));
#pragma once

#include <string>

namespace shoal::testing {

// `queue_policy` goes inside dynamic_batching (e.g. a default_queue_policy).
inline std::string HeldConfig(const std::string& name, const std::string& queue_policy = "") {
  return "name: \"" + name + "\"\nbackend: \"cost_model\"\nmax_batch_size: 8\n" +
         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
         "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
         "dynamic_batching { max_queue_delay_microseconds: 600000000 " +
         queue_policy +
         " }\n"
         "parameters { key: \"batching_policy\" value { string_value: \"fixed_window\" } }\n"
         "parameters { key: \"a_us\" value { string_value: \"0\" } }\n"
         "parameters { key: \"b_us\" value { string_value: \"0\" } }\n";
}

}  // namespace shoal::testing

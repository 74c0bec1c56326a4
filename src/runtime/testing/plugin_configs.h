// config.pbtxt texts of models served by the example plugins (examples/backends), shared
// by the in-process server tests (test_repository.h) and the end-to-end tests, which write
// them into the repositories they serve. Header-only, no dependencies.
#pragma once

namespace shoal::runtime::testing {

// INPUT0 -> OUTPUT0, FP32, batching up to 8, one variable dimension.
inline constexpr char kIdentityConfig[] = R"(
name: "identity"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)";

// BYTES identity without batching.
inline constexpr char kStringsConfig[] = R"(
name: "strings"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
)";

// OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1; INT32 [4], no batching.
inline constexpr char kAddSubConfig[] = R"(
name: "add_sub"
backend: "add_sub"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
)";

}  // namespace shoal::runtime::testing

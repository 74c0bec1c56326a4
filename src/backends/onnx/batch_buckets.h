// Batch buckets: the batch sizes a GPU instance keeps plans for.
//
// A work-conserving batcher runs every batch size from 1 to max_batch_size. On the CPU each
// size keeps its own plan (engine::Session shares one arena among them). A GPU plan holds
// its own device arena, two slots of device buffers and a CUDA graph per slot, so a plan
// per size would cost memory in proportion and a plan creation (graph capture included)
// on the request path whenever a size was evicted. So a GPU instance of a batching model
// runs a batch of n rows on the plan of the smallest bucket >= n: the inputs' rows are
// copied in, the bucket's other rows repeat the last of them (so they raise no error that
// a real row would not), and only n rows' outputs come back.
// Every input and output of a batching model is batch-major (the onnx backend checks at
// load), so no row reads another.
//
// Default buckets: 1, 2, 4, 8, then each power of two and one and a half times it (12, 16,
// 24, 32, 48, 64...), those below max_batch_size, and max_batch_size itself. Past 8 rows a
// batch computes at most half again as many rows as it has (17 rows on the plan of 24), up
// to twice as many below; a GPU at such sizes is bound by its launches and copies more
// than by its rows. max_batch_size 32 gives 8 buckets, 256 gives 14.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace shoal::backends {

// The default buckets for a model's max_batch_size (>= 1), ascending.
std::vector<int64_t> DefaultBatchBuckets(int64_t max_batch_size);

// The config parameter `gpu_batch_buckets`: "auto" (DefaultBatchBuckets), "exact" (no
// buckets: a plan per batch size, returned empty), or a comma-separated ascending list of
// sizes from 1 to max_batch_size; max_batch_size is added when the list lacks it.
// INVALID_ARGUMENT naming the parameter otherwise.
StatusOr<std::vector<int64_t>> ParseBatchBuckets(const std::string& text, int64_t max_batch_size);

// The smallest bucket >= rows; `rows` itself when `buckets` is empty or all are smaller.
int64_t BucketFor(const std::vector<int64_t>& buckets, int64_t rows);

}  // namespace shoal::backends

#include "backends/onnx/batch_buckets.h"

#include <algorithm>

namespace shoal::backends {

std::vector<int64_t> DefaultBatchBuckets(int64_t max_batch_size) {
  std::vector<int64_t> buckets;
  auto add = [&](int64_t size) {
    if (size < max_batch_size) buckets.push_back(size);
  };
  for (int64_t size = 1; size < 8; size *= 2) add(size);
  for (int64_t size = 8; size < max_batch_size; size *= 2) {
    add(size);
    add(size + size / 2);
  }
  buckets.push_back(std::max<int64_t>(1, max_batch_size));
  return buckets;
}

StatusOr<std::vector<int64_t>> ParseBatchBuckets(const std::string& text, int64_t max_batch_size) {
  if (text == "auto") return DefaultBatchBuckets(max_batch_size);
  if (text == "exact") return std::vector<int64_t>{};
  auto bad = [&](const std::string& why) {
    return InvalidArgument(
        "parameter gpu_batch_buckets must be auto, exact or ascending batch "
        "sizes from 1 to max_batch_size (" +
        std::to_string(max_batch_size) + ") separated by commas; '" + text + "' " + why);
  };
  std::vector<int64_t> buckets;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(begin, end - begin);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    int64_t size = 0;
    bool number = !item.empty() && item.size() <= 9;
    for (char c : item) {
      number = number && c >= '0' && c <= '9';
      if (number) size = size * 10 + (c - '0');
    }
    if (!number) return bad("has '" + item + "', not a whole number");
    if (size < 1 || size > max_batch_size)
      return bad("has " + item + ", outside 1.." + std::to_string(max_batch_size));
    if (!buckets.empty() && size <= buckets.back()) return bad("is not ascending");
    buckets.push_back(size);
    begin = end + 1;
  }
  if (buckets.back() != max_batch_size) buckets.push_back(max_batch_size);
  return buckets;
}

int64_t BucketFor(const std::vector<int64_t>& buckets, int64_t rows) {
  auto it = std::lower_bound(buckets.begin(), buckets.end(), rows);
  return it == buckets.end() ? rows : *it;
}

}  // namespace shoal::backends

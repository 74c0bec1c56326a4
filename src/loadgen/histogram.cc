#include "loadgen/histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace shoal::loadgen {
namespace {

// 3 significant digits: 2 * 10^3 distinct values per power of two, rounded up to 2^11.
constexpr int kSubBucketCountMagnitude = 11;
constexpr int kSubBucketHalfCountMagnitude = kSubBucketCountMagnitude - 1;
constexpr int64_t kSubBucketCount = int64_t{1} << kSubBucketCountMagnitude;
constexpr int64_t kSubBucketHalfCount = kSubBucketCount / 2;
constexpr int64_t kSubBucketMask = kSubBucketCount - 1;

int BucketIndex(int64_t value) {
  const int pow2_ceiling = 64 - std::countl_zero(static_cast<uint64_t>(value | kSubBucketMask));
  return pow2_ceiling - (kSubBucketHalfCountMagnitude + 1);
}

}  // namespace

Histogram::Histogram(int64_t highest_trackable_value)
    : highest_(std::max<int64_t>(highest_trackable_value, 2 * kSubBucketCount)) {
  int64_t smallest_untrackable = kSubBucketCount;
  int buckets = 1;
  while (smallest_untrackable <= highest_) {
    if (smallest_untrackable > INT64_MAX / 2) {
      ++buckets;
      break;
    }
    smallest_untrackable <<= 1;
    ++buckets;
  }
  bucket_count_ = buckets;
  counts_.assign(static_cast<size_t>((bucket_count_ + 1) * kSubBucketHalfCount), 0);
}

int Histogram::CountsIndex(int64_t value) const {
  const int bucket = BucketIndex(value);
  const int64_t sub_bucket = value >> bucket;
  return static_cast<int>((static_cast<int64_t>(bucket + 1) << kSubBucketHalfCountMagnitude) +
                          (sub_bucket - kSubBucketHalfCount));
}

int64_t Histogram::ValueFromIndex(int index) const {
  int bucket = (index >> kSubBucketHalfCountMagnitude) - 1;
  int64_t sub_bucket = (index & (kSubBucketHalfCount - 1)) + kSubBucketHalfCount;
  if (bucket < 0) {
    sub_bucket -= kSubBucketHalfCount;
    bucket = 0;
  }
  return sub_bucket << bucket;
}

int64_t Histogram::LowestEquivalent(int64_t value) const {
  const int bucket = BucketIndex(value);
  return (value >> bucket) << bucket;
}

int64_t Histogram::HighestEquivalent(int64_t value) const {
  const int bucket = BucketIndex(value);
  return LowestEquivalent(value) + (int64_t{1} << bucket) - 1;
}

void Histogram::Record(int64_t value, int64_t count) {
  if (count <= 0) return;
  if (value < 0) value = 0;
  if (value > highest_) {
    value = highest_;
    clamped_ += count;
  }
  counts_[static_cast<size_t>(CountsIndex(value))] += count;
  total_count_ += count;
  min_ = std::min(min_, value);
  max_ = std::max(max_, value);
  sum_ += static_cast<long double>(value) * count;
}

void Histogram::Merge(const Histogram& other) {
  const size_t n = std::min(counts_.size(), other.counts_.size());
  for (size_t i = 0; i < n; ++i) counts_[i] += other.counts_[i];
  total_count_ += other.total_count_;
  if (other.total_count_ > 0) {
    min_ = std::min(min_, other.min_);
    max_ = std::max(max_, other.max_);
  }
  sum_ += other.sum_;
  clamped_ += other.clamped_;
}

void Histogram::Reset() {
  std::fill(counts_.begin(), counts_.end(), 0);
  total_count_ = 0;
  min_ = INT64_MAX;
  max_ = 0;
  sum_ = 0;
  clamped_ = 0;
}

double Histogram::mean() const {
  return total_count_ == 0 ? 0.0 : static_cast<double>(sum_ / total_count_);
}

int64_t Histogram::ValueAtPercentile(double percentile) const {
  if (total_count_ == 0) return 0;
  percentile = std::clamp(percentile, 0.0, 100.0);
  // The rank of the wanted value (1-based, nearest-rank definition).
  int64_t rank = static_cast<int64_t>(std::ceil(percentile / 100.0 * total_count_ - 1e-9));
  rank = std::clamp<int64_t>(rank, 1, total_count_);
  int64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      // Never report beyond what was seen: the top bucket's end may exceed max().
      return std::min(HighestEquivalent(ValueFromIndex(static_cast<int>(i))), max_);
    }
  }
  return max_;
}

int64_t Histogram::CountAtOrBelow(int64_t value) const {
  if (value < 0) return 0;
  if (value >= highest_) return total_count_;
  const int last = CountsIndex(value);
  int64_t n = 0;
  for (int i = 0; i <= last; ++i) n += counts_[static_cast<size_t>(i)];
  return n;
}

}  // namespace shoal::loadgen

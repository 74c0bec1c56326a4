// Histogram: a latency histogram in the manner of HdrHistogram, with a fixed relative
// precision of 3 significant decimal digits over [1, highest_trackable_value].
//
// Values are non-negative integers (shoal bench records nanoseconds). Buckets are
// log-linear: each power-of-two range is split into 1024 equal sub-buckets (2048 in the
// first), so any recorded value is reported as the highest value of its sub-bucket,
// which is within 1/1024 (< 0.1%) above the true value. Memory is fixed at construction
// (about 270 KiB for the default range of one hour in nanoseconds); Record is O(1) and
// allocation-free, so the load generator can call it per request.
//
// Values above highest_trackable_value are clamped to it (and counted); negative values
// are recorded as 0. min(), max(), count() and mean() are exact.
//
// Not thread-safe: keep one per thread or per measurement window and Merge them.
#pragma once

#include <cstdint>
#include <vector>

namespace shoal::loadgen {

class Histogram {
 public:
  // One hour in nanoseconds.
  static constexpr int64_t kDefaultHighestTrackable = 3'600'000'000'000;

  explicit Histogram(int64_t highest_trackable_value = kDefaultHighestTrackable);

  void Record(int64_t value, int64_t count = 1);
  // Adds every value recorded in `other` (which must have the same range).
  void Merge(const Histogram& other);
  void Reset();

  // The smallest recorded value v such that at least percentile% of the values are <= v,
  // reported as the highest value equivalent to it (0 when empty). percentile in [0, 100].
  int64_t ValueAtPercentile(double percentile) const;
  // How many recorded values are <= value, to the histogram's precision (values sharing
  // value's bucket count as <= it).
  int64_t CountAtOrBelow(int64_t value) const;
  int64_t count() const { return total_count_; }
  int64_t min() const { return total_count_ == 0 ? 0 : min_; }
  int64_t max() const { return total_count_ == 0 ? 0 : max_; }
  double mean() const;
  int64_t clamped_count() const { return clamped_; }
  int64_t highest_trackable_value() const { return highest_; }

  // The range [lowest, highest] of values that share `value`'s bucket.
  int64_t LowestEquivalent(int64_t value) const;
  int64_t HighestEquivalent(int64_t value) const;

 private:
  int CountsIndex(int64_t value) const;
  int64_t ValueFromIndex(int index) const;

  int64_t highest_;
  int bucket_count_ = 0;
  std::vector<int64_t> counts_;
  int64_t total_count_ = 0;
  int64_t min_ = INT64_MAX;
  int64_t max_ = 0;
  long double sum_ = 0;
  int64_t clamped_ = 0;
};

}  // namespace shoal::loadgen

// The machine's FMA peak, measured by the engine benchmark itself: an FMA loop with 12
// independent vector accumulators (AVX-512 when the CPU has it, else AVX2), one pinned
// thread per benchmark thread. Measured once at the start (the headline) and again just
// before every timed run (kProbeSeconds), so that a run's GFLOP/s is read against the
// peak of its own minute (Pair).
#pragma once

#include <string>
#include <vector>

namespace shoal::bench {

struct Peak {
  std::string isa;  // "avx512f+fma", "avx2+fma", "none"
  double gflops = 0;
};

// Runs the FMA loop on `threads` threads side by side, each pinned to one of the CPUs
// this process may use: the machine's peak at the moment it runs.
class FmaProbe {
 public:
  explicit FmaProbe(int threads);
  bool available() const { return loop_ != nullptr; }
  const std::string& isa() const { return isa_; }
  // GFLOP/s of one measurement lasting about `seconds`; 0 when there is no FMA loop.
  double Measure(double seconds) const;

 private:
  int threads_;
  std::string isa_ = "none";
  double (*loop_)(double, float*) = nullptr;
  std::vector<int> cpus_;
};

// The headline peak: median of 3 half-second measurements.
Peak MeasureFmaPeak(const FmaProbe& probe);

// The peak measured beside each timed run, just before it (kProbeSeconds), and each
// run's GFLOP/s as a fraction of its own probe. This VM's speed drifts by tens of percent
// from minute to minute (other tenants on the host). Pairing takes out the part of that
// drift the FMA loop feels too (time the host takes away, clock changes); contention for
// caches and memory bandwidth, which a loop in registers does not feel, still shows.
constexpr double kProbeSeconds = 0.5;

struct PeakBeside {
  double gflops = 0;    // median of the probes
  double fraction = 0;  // median over runs of (run GFLOP/s / its probe); 0: not measured
};

// Median of `v`; 0 when empty.
double Median(std::vector<double> v);

// `gflops[i]` beside `peaks[i]`; empty (0, 0) unless both have the same, non-zero length
// and every probe is positive.
PeakBeside Pair(const std::vector<double>& gflops, const std::vector<double>& peaks);

}  // namespace shoal::bench

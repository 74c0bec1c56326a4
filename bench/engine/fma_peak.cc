#include "fma_peak.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace shoal::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Each loop keeps 12 independent accumulators (enough to cover FMA latency x throughput on
// current cores) and returns the FLOPs it did in about `seconds`; `sink` defeats dead code
// elimination. Compiled for the ISA by target attributes, chosen at run time.
__attribute__((target("avx512f,fma"))) double FmaLoopAvx512(double seconds, float* sink) {
  __m512 a0 = _mm512_set1_ps(0.1f), a1 = _mm512_set1_ps(0.2f), a2 = _mm512_set1_ps(0.3f),
         a3 = _mm512_set1_ps(0.4f), a4 = _mm512_set1_ps(0.5f), a5 = _mm512_set1_ps(0.6f),
         a6 = _mm512_set1_ps(0.7f), a7 = _mm512_set1_ps(0.8f), a8 = _mm512_set1_ps(0.9f),
         a9 = _mm512_set1_ps(1.0f), a10 = _mm512_set1_ps(1.1f), a11 = _mm512_set1_ps(1.2f);
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  constexpr int64_t kInner = 1 << 16;
  int64_t iters = 0;
  auto start = std::chrono::steady_clock::now();
  do {
    for (int64_t i = 0; i < kInner; ++i) {
      a0 = _mm512_fmadd_ps(a0, b, c);
      a1 = _mm512_fmadd_ps(a1, b, c);
      a2 = _mm512_fmadd_ps(a2, b, c);
      a3 = _mm512_fmadd_ps(a3, b, c);
      a4 = _mm512_fmadd_ps(a4, b, c);
      a5 = _mm512_fmadd_ps(a5, b, c);
      a6 = _mm512_fmadd_ps(a6, b, c);
      a7 = _mm512_fmadd_ps(a7, b, c);
      a8 = _mm512_fmadd_ps(a8, b, c);
      a9 = _mm512_fmadd_ps(a9, b, c);
      a10 = _mm512_fmadd_ps(a10, b, c);
      a11 = _mm512_fmadd_ps(a11, b, c);
    }
    iters += kInner;
  } while (Seconds(start, std::chrono::steady_clock::now()) < seconds);
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  float lanes[16];  // (_mm512_reduce_add_ps trips GCC 12's -Wuninitialized)
  _mm512_storeu_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  *sink = sum;
  return static_cast<double>(iters) * 12 * 16 * 2;
}

__attribute__((target("avx2,fma"))) double FmaLoopAvx2(double seconds, float* sink) {
  __m256 a0 = _mm256_set1_ps(0.1f), a1 = _mm256_set1_ps(0.2f), a2 = _mm256_set1_ps(0.3f),
         a3 = _mm256_set1_ps(0.4f), a4 = _mm256_set1_ps(0.5f), a5 = _mm256_set1_ps(0.6f),
         a6 = _mm256_set1_ps(0.7f), a7 = _mm256_set1_ps(0.8f), a8 = _mm256_set1_ps(0.9f),
         a9 = _mm256_set1_ps(1.0f), a10 = _mm256_set1_ps(1.1f), a11 = _mm256_set1_ps(1.2f);
  const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  constexpr int64_t kInner = 1 << 16;
  int64_t iters = 0;
  auto start = std::chrono::steady_clock::now();
  do {
    for (int64_t i = 0; i < kInner; ++i) {
      a0 = _mm256_fmadd_ps(a0, b, c);
      a1 = _mm256_fmadd_ps(a1, b, c);
      a2 = _mm256_fmadd_ps(a2, b, c);
      a3 = _mm256_fmadd_ps(a3, b, c);
      a4 = _mm256_fmadd_ps(a4, b, c);
      a5 = _mm256_fmadd_ps(a5, b, c);
      a6 = _mm256_fmadd_ps(a6, b, c);
      a7 = _mm256_fmadd_ps(a7, b, c);
      a8 = _mm256_fmadd_ps(a8, b, c);
      a9 = _mm256_fmadd_ps(a9, b, c);
      a10 = _mm256_fmadd_ps(a10, b, c);
      a11 = _mm256_fmadd_ps(a11, b, c);
    }
    iters += kInner;
  } while (Seconds(start, std::chrono::steady_clock::now()) < seconds);
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  *sink = sum;
  return static_cast<double>(iters) * 12 * 8 * 2;
}

}  // namespace

FmaProbe::FmaProbe(int threads) : threads_(std::max(1, threads)) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
    isa_ = "avx512f+fma";
    loop_ = FmaLoopAvx512;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    isa_ = "avx2+fma";
    loop_ = FmaLoopAvx2;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus_.push_back(c);
}

double FmaProbe::Measure(double seconds) const {
  if (!loop_) return 0;
  std::vector<double> flops(threads_, 0);
  std::vector<float> sinks(threads_, 0);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads_; ++t) {
    workers.emplace_back([&, t] {
      if (!cpus_.empty()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus_[static_cast<size_t>(t) % cpus_.size()], &one);
        pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
      }
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      flops[t] = loop_(seconds, &sinks[t]);
    });
  }
  while (ready.load() < threads_) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& w : workers) w.join();
  const double elapsed = Seconds(start, std::chrono::steady_clock::now());
  double total = 0;
  for (double f : flops) total += f;
  return total / elapsed / 1e9;
}

Peak MeasureFmaPeak(const FmaProbe& probe) {
  Peak peak;
  peak.isa = probe.isa();
  if (!probe.available()) return peak;
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) rates.push_back(probe.Measure(0.5));
  peak.gflops = Median(rates);
  return peak;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

PeakBeside Pair(const std::vector<double>& gflops, const std::vector<double>& peaks) {
  PeakBeside p;
  if (gflops.empty() || gflops.size() != peaks.size()) return p;
  std::vector<double> fractions;
  for (size_t i = 0; i < gflops.size(); ++i)
    if (peaks[i] > 0) fractions.push_back(gflops[i] / peaks[i]);
  if (fractions.size() != gflops.size()) return p;
  p.gflops = Median(peaks);
  p.fraction = Median(fractions);
  return p;
}

}  // namespace shoal::bench

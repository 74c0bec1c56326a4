#include "loadgen/driver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "loadgen/schedule.h"

namespace shoal::loadgen {
namespace {

constexpr int64_t kMs = 1'000'000;

// A transport on a FakeClock: every request takes service_ns. With serial = true one
// request is served at a time (a slow server: the rest queue behind it); otherwise all
// run in parallel. Wait moves the fake clock to the next completion or the deadline.
class FakeTransport : public Transport {
 public:
  FakeTransport(FakeClock* clock, int64_t service_ns, int64_t capacity, bool serial = false)
      : clock_(clock), service_ns_(service_ns), capacity_(capacity), serial_(serial) {}

  int64_t capacity() const override { return capacity_; }
  Status Start(uint64_t tag, size_t payload) override {
    EXPECT_LT(static_cast<int64_t>(pending_.size()), capacity_);
    const int64_t now = clock_->NowNs();
    int64_t begin = now;
    if (serial_ && last_end_ns_ > now) begin = last_end_ns_;
    last_end_ns_ = begin + service_ns_;
    pending_.emplace(last_end_ns_, tag);
    send_times_.push_back(now);
    payloads_.push_back(payload);
    return Status::Ok();
  }
  void Wait(int64_t deadline_ns, std::vector<Completion>* done) override {
    const int64_t now = clock_->NowNs();
    const int64_t target =
        pending_.empty() ? deadline_ns : std::min(deadline_ns, pending_.begin()->first);
    if (target > now) clock_->AdvanceNs(target - now);
    while (!pending_.empty() && pending_.begin()->first <= clock_->NowNs()) {
      Completion c;
      c.tag = pending_.begin()->second;
      c.end_ns = pending_.begin()->first;
      ++completed_;
      c.ok = fail_every_ == 0 || completed_ % fail_every_ != 0;
      c.code = c.ok ? 200 : 503;
      done->push_back(c);
      pending_.erase(pending_.begin());
    }
  }
  std::string CodeName(int code) const override { return "HTTP " + std::to_string(code); }

  int64_t fail_every_ = 0;
  std::vector<int64_t> send_times_;
  std::vector<size_t> payloads_;

 private:
  FakeClock* clock_;
  int64_t service_ns_;
  int64_t capacity_;
  bool serial_;
  int64_t last_end_ns_ = 0;
  int64_t completed_ = 0;
  std::multimap<int64_t, uint64_t> pending_;
};

Sampler CountingSampler(int* calls) {
  return [calls] {
    ++*calls;
    Sample s;
    s.cpu_ns = *calls * 1000;
    return s;
  };
}

TEST(ArrivalScheduleTest, ConstantGapsAreExactOnAverage) {
  ArrivalSchedule s(0, 3000, Distribution::kConstant, 1);  // 333333.33 ns gaps
  int64_t first = s.Pop(), last = first;
  for (int i = 0; i < 30'000; ++i) {
    const int64_t t = s.Pop();
    EXPECT_NEAR(static_cast<double>(t - last), 1e9 / 3000, 1.0);
    last = t;
  }
  EXPECT_EQ(first, 0);
  EXPECT_NEAR(static_cast<double>(last - first), 10e9, 2.0);  // no drift
}

TEST(ArrivalScheduleTest, PoissonGapsAreExponentialWithTheRightMean) {
  ArrivalSchedule s(0, 1000, Distribution::kPoisson, 12345);
  const int n = 200'000;
  double sum = 0, sum_sq = 0;
  int64_t last = s.Pop();
  for (int i = 0; i < n; ++i) {
    const double gap = static_cast<double>(s.Pop() - last);
    last += static_cast<int64_t>(gap);
    sum += gap;
    sum_sq += gap * gap;
  }
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 1e6, 0.01 * 1e6);
  EXPECT_NEAR(stddev / mean, 1.0, 0.02);  // exponential: coefficient of variation 1

  ArrivalSchedule a(0, 1000, Distribution::kPoisson, 7), b(0, 1000, Distribution::kPoisson, 7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Pop(), b.Pop());
}

TEST(ArrivalScheduleTest, BurstsSendOnlyInTheOnPartAtTheMeanRate) {
  // 1000/s on average, in bursts: the first quarter of every 200 ms sends at 4000/s.
  constexpr int64_t kPeriod = 200 * kMs;
  ArrivalSchedule s(5 * kMs, 1000, Distribution::kBurst, 99, kPeriod, 0.25);
  int64_t count = 0, last = 0;
  std::map<int64_t, int64_t> per_period;
  while (true) {
    const int64_t t = s.Pop();
    if (t >= 5 * kMs + 100 * kPeriod) break;  // 20 s
    EXPECT_GE(t, last) << "send times never go back";
    last = t;
    const int64_t into = (t - 5 * kMs) % kPeriod;
    EXPECT_LT(into, kPeriod / 4) << "a send at " << into
                                 << " ns into its period is outside the burst";
    ++per_period[(t - 5 * kMs) / kPeriod];
    ++count;
  }
  EXPECT_NEAR(static_cast<double>(count), 20'000, 0.03 * 20'000);  // the mean rate holds
  EXPECT_EQ(per_period.size(), 100u) << "every period has its burst";
  for (const auto& [period, n] : per_period) EXPECT_NEAR(static_cast<double>(n), 200, 70) << period;
}

TEST(DriverTest, ClosedLoopKeepsConcurrencyOutstanding) {
  FakeClock clock(0);
  FakeTransport transport(&clock, 2 * kMs, 16);
  StepConfig c;
  c.concurrency = 4;
  c.warmup_ns = 10 * kMs;
  c.window_ns = 100 * kMs;
  c.payload_count = 3;
  int samples = 0;
  StepResult r = RunStep(transport, clock, c, CountingSampler(&samples));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.stable);
  ASSERT_EQ(r.windows.size(), 3u);
  EXPECT_EQ(samples, 4);  // each boundary once
  for (const Window& w : r.windows) {
    EXPECT_NEAR(static_cast<double>(w.ok), 4 * 100 / 2, 4);
    EXPECT_EQ(w.latency_ns.min(), 2 * kMs);
    EXPECT_EQ(w.latency_ns.max(), 2 * kMs);
    EXPECT_EQ(w.errors_total(), 0);
    EXPECT_EQ(w.late_sends, 0);
  }
  EXPECT_EQ(r.windows[0].start_ns, 10 * kMs);
  EXPECT_EQ(r.windows[1].start_sample.cpu_ns, r.windows[0].end_sample.cpu_ns);
  EXPECT_EQ(r.undrained, 0);
  // Payloads are used round-robin.
  EXPECT_EQ(transport.payloads_[0], 0u);
  EXPECT_EQ(transport.payloads_[4], 1u);
  EXPECT_EQ(transport.payloads_[5], 2u);
}

TEST(DriverTest, ClosedLoopCountsErrorsByCode) {
  FakeClock clock(0);
  FakeTransport transport(&clock, 1 * kMs, 4);
  transport.fail_every_ = 10;
  StepConfig c;
  c.concurrency = 1;
  c.window_ns = 100 * kMs;
  c.max_windows = 1;
  c.min_windows = 1;
  int samples = 0;
  StepResult r = RunStep(transport, clock, c, CountingSampler(&samples));
  ASSERT_EQ(r.windows.size(), 1u);
  // Replies at 1..99 ms; the one at 100 ms belongs to the next window, which never runs.
  EXPECT_EQ(r.windows[0].errors.at("HTTP 503"), 9);
  EXPECT_EQ(r.windows[0].ok, 90);
  // How long the errors took is measured apart from the successes.
  ASSERT_EQ(r.windows[0].error_latency_ns.count("HTTP 503"), 1u);
  EXPECT_EQ(r.windows[0].error_latency_ns.at("HTTP 503").count(), 9);
  EXPECT_EQ(r.windows[0].error_latency_ns.at("HTTP 503").max(), 1 * kMs);
  EXPECT_EQ(r.windows[0].latency_ns.count(), 90);
}

TEST(DriverTest, OpenLoopFollowsTheSchedule) {
  FakeClock clock(0);
  FakeTransport transport(&clock, 1 * kMs, 100);
  StepConfig c;
  c.open_loop = true;
  c.rate_per_s = 1000;
  c.window_ns = 100 * kMs;
  int samples = 0;
  StepResult r = RunStep(transport, clock, c, CountingSampler(&samples));
  EXPECT_TRUE(r.stable);
  ASSERT_GE(r.windows.size(), 3u);
  for (const Window& w : r.windows) {
    EXPECT_NEAR(static_cast<double>(w.ok), 100, 1);
    EXPECT_EQ(w.late_sends, 0);
    EXPECT_EQ(w.capacity_waits, 0);
    EXPECT_EQ(w.latency_ns.max(), 1 * kMs);
  }
  // Sends are 1 ms apart, exactly on schedule.
  for (size_t i = 1; i < 50; ++i) {
    EXPECT_EQ(transport.send_times_[i] - transport.send_times_[i - 1], 1 * kMs);
  }
}

TEST(DriverTest, OpenLoopMeasuresFromTheScheduledTimeWhenTheSenderFallsBehind) {
  // One slot and a 2 ms service time against 1 request/ms: request k is scheduled at
  // k ms but can only be sent at 2k ms, so its latency from schedule is k + 2 ms, while
  // the time from its actual send is always 2 ms.
  FakeClock clock(0);
  FakeTransport transport(&clock, 2 * kMs, 1, /*serial=*/true);
  StepConfig c;
  c.open_loop = true;
  c.rate_per_s = 1000;
  c.window_ns = 20 * kMs;
  c.min_windows = 1;
  c.max_windows = 1;
  c.drain_timeout_ns = 1000 * kMs;
  int samples = 0;
  StepResult r = RunStep(transport, clock, c, CountingSampler(&samples));
  ASSERT_EQ(r.windows.size(), 1u);
  const Window& w = r.windows[0];
  EXPECT_NEAR(static_cast<double>(w.ok), 10, 1);  // half the offered rate
  EXPECT_GT(w.late_sends, 5);
  EXPECT_GT(w.capacity_waits, 5);
  EXPECT_GE(w.max_send_lag_ns, 8 * kMs);
  EXPECT_EQ(w.latency_ns.min(), 2 * kMs);  // the first request was on time
  // The last reply in the window (request 8, done at 18 ms) was scheduled at 8 ms.
  EXPECT_EQ(w.latency_ns.max(), 10 * kMs);
  // From the actual send every request took the server's 2 ms: the rest was the client's
  // own lag, which the window keeps apart.
  EXPECT_EQ(w.latency_from_send_ns.count(), w.ok);
  EXPECT_EQ(w.latency_from_send_ns.min(), 2 * kMs);
  EXPECT_EQ(w.latency_from_send_ns.max(), 2 * kMs);
  EXPECT_EQ(w.send_lag_ns.count(), w.sent);
  EXPECT_EQ(w.send_lag_ns.max(), w.max_send_lag_ns);
  EXPECT_EQ(r.undrained, 0);
}

TEST(DriverTest, OpenLoopErrorsAreTimedFromScheduleAndFromSend) {
  // As above (one slot, 2 ms per request, 1 request/ms), every 2nd reply an error: an
  // error's time from its schedule grows with the client's backlog, from its send it is
  // the server's 2 ms.
  FakeClock clock(0);
  FakeTransport transport(&clock, 2 * kMs, 1, /*serial=*/true);
  transport.fail_every_ = 2;
  StepConfig c;
  c.open_loop = true;
  c.rate_per_s = 1000;
  c.window_ns = 40 * kMs;
  c.min_windows = 1;
  c.max_windows = 1;
  c.drain_timeout_ns = 1000 * kMs;
  int samples = 0;
  StepResult r = RunStep(transport, clock, c, CountingSampler(&samples));
  ASSERT_EQ(r.windows.size(), 1u);
  const Window& w = r.windows[0];
  ASSERT_EQ(w.error_latency_ns.count("HTTP 503"), 1u);
  ASSERT_EQ(w.error_latency_from_send_ns.count("HTTP 503"), 1u);
  const Histogram& scheduled = w.error_latency_ns.at("HTTP 503");
  const Histogram& sent = w.error_latency_from_send_ns.at("HTTP 503");
  EXPECT_GE(scheduled.count(), 8);
  EXPECT_EQ(sent.count(), scheduled.count());
  EXPECT_GE(scheduled.max(), 15 * kMs);
  EXPECT_EQ(sent.min(), 2 * kMs);
  EXPECT_EQ(sent.max(), 2 * kMs);
}

TEST(DriverTest, ClosedLoopLatencyFromSendEqualsLatency) {
  FakeClock clock(0);
  FakeTransport transport(&clock, 3 * kMs, 4);
  StepConfig c;
  c.concurrency = 2;
  c.window_ns = 30 * kMs;
  c.min_windows = 1;
  c.max_windows = 1;
  int samples = 0;
  StepResult r = RunStep(transport, clock, c, CountingSampler(&samples));
  ASSERT_EQ(r.windows.size(), 1u);
  const Window& w = r.windows[0];
  EXPECT_EQ(w.latency_from_send_ns.count(), w.latency_ns.count());
  EXPECT_EQ(w.latency_from_send_ns.max(), 3 * kMs);
  EXPECT_EQ(w.latency_ns.max(), 3 * kMs);
  EXPECT_EQ(w.send_lag_ns.count(), 0);  // closed loop has no schedule to lag behind
}

}  // namespace
}  // namespace shoal::loadgen

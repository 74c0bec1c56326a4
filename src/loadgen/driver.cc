#include "loadgen/driver.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

#include "loadgen/schedule.h"

namespace shoal::loadgen {

int64_t Window::errors_total() const {
  int64_t n = 0;
  for (const auto& [name, count] : errors) n += count;
  return n;
}

double StabilityLatencyNs(const Histogram& h, const std::optional<double>& percentile) {
  return percentile ? static_cast<double>(h.ValueAtPercentile(*percentile)) : h.mean();
}

namespace {

bool WithinPercent(const double* values, int n, double percentage) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += values[i];
  mean /= n;
  for (int i = 0; i < n; ++i) {
    if (std::abs(values[i] - mean) > mean * percentage / 100.0) return false;
  }
  return true;
}

bool LastThreeStable(const std::vector<Window>& w, const StepConfig& c) {
  if (w.size() < 3) return false;
  double throughput[3], latency[3];
  for (int i = 0; i < 3; ++i) {
    const Window& x = w[w.size() - 3 + i];
    throughput[i] = static_cast<double>(x.ok) / std::max(x.duration_s(), 1e-9);
    latency[i] = StabilityLatencyNs(x.latency_ns, c.percentile);
  }
  return WithinPercent(throughput, 3, c.stability_percentage) &&
         WithinPercent(latency, 3, c.stability_percentage);
}

class StepRunner {
 public:
  StepRunner(Transport& t, const Clock& clock, const StepConfig& c, const Sampler& s)
      : transport_(t), clock_(clock), config_(c), sampler_(s) {
    result_.config = c;
  }

  StepResult Run() {
    const int64_t start = clock_.NowNs();
    measure_from_ = start + config_.warmup_ns;
    if (config_.open_loop) {
      schedule_.emplace(start, config_.rate_per_s, config_.distribution, config_.seed,
                        config_.burst_period_ns, config_.burst_on_fraction);
    } else {
      for (int64_t i = 0; i < config_.concurrency && result_.status.ok(); ++i) Send(start);
    }
    std::vector<Completion> done;
    bool running = true;
    while (running && result_.status.ok()) {
      const int64_t now = clock_.NowNs();
      if (!AdvanceWindows(now)) break;
      if (config_.open_loop) SendDue(now);
      int64_t deadline = current_ ? current_->start_ns + config_.window_ns : measure_from_;
      if (config_.open_loop && in_flight_ < transport_.capacity()) {
        deadline = std::min(deadline, schedule_->next_ns());
      }
      done.clear();
      transport_.Wait(deadline, &done);
      for (const Completion& c : done) {
        // A reply belongs to the window its end time falls in, even when it arrived
        // together with replies from before a boundary.
        if (running && !AdvanceWindows(c.end_ns)) running = false;
        OnCompletion(c, running);
      }
    }
    Drain();
    return std::move(result_);
  }

 private:
  // Opens and closes windows as time passes; false when the step is over.
  bool AdvanceWindows(int64_t now) {
    if (!current_ && now >= measure_from_) OpenWindow(measure_from_, sampler_());
    while (current_ && now >= current_->start_ns + config_.window_ns) {
      const int64_t end = current_->start_ns + config_.window_ns;
      Sample sample = sampler_();
      current_->end_ns = end;
      current_->end_sample = sample;
      result_.windows.push_back(std::move(*current_));
      current_.reset();
      const auto n = static_cast<int64_t>(result_.windows.size());
      if (n >= config_.min_windows && LastThreeStable(result_.windows, config_)) {
        result_.stable = true;
        return false;
      }
      if (n >= config_.max_windows) return false;
      OpenWindow(end, std::move(sample));
    }
    return true;
  }

  void OpenWindow(int64_t start, Sample sample) {
    current_.emplace();
    current_->start_ns = start;
    current_->start_sample = std::move(sample);
  }

  // The transport's tag is a slot in origins_: the request's scheduled and actual send.
  void Send(int64_t origin_ns) {
    uint32_t slot;
    if (free_origins_.empty()) {
      slot = static_cast<uint32_t>(origins_.size());
      origins_.emplace_back();
    } else {
      slot = free_origins_.back();
      free_origins_.pop_back();
    }
    origins_[slot] = {origin_ns, clock_.NowNs()};
    Status s = transport_.Start(slot, next_payload_++ % config_.payload_count);
    if (!s.ok()) {
      free_origins_.push_back(slot);
      result_.status = s;
      return;
    }
    ++in_flight_;
    if (current_) ++current_->sent;
  }

  // Open loop: moves every send that is due into the backlog, then sends what capacity
  // allows, oldest first.
  void SendDue(int64_t now) {
    while (schedule_->next_ns() <= now) backlog_.push_back({schedule_->Pop(), false});
    while (!backlog_.empty() && in_flight_ < transport_.capacity() && result_.status.ok()) {
      const int64_t scheduled = backlog_.front().scheduled_ns;
      backlog_.pop_front();
      const int64_t lag = clock_.NowNs() - scheduled;
      if (current_) {
        if (lag > config_.late_threshold_ns) ++current_->late_sends;
        current_->max_send_lag_ns = std::max(current_->max_send_lag_ns, lag);
        current_->send_lag_ns.Record(std::max<int64_t>(lag, 0));
      }
      Send(scheduled);
    }
    // What is left found every slot busy; count each such send once.
    for (auto it = backlog_.rbegin(); it != backlog_.rend() && !it->counted; ++it) {
      it->counted = true;
      if (current_) ++current_->capacity_waits;
    }
  }

  void OnCompletion(const Completion& c, bool running) {
    --in_flight_;
    const Origin origin = origins_[c.tag];
    free_origins_.push_back(static_cast<uint32_t>(c.tag));
    if (!running) return;
    if (current_ && c.end_ns >= current_->start_ns) {
      if (c.ok) {
        ++current_->ok;
        current_->latency_ns.Record(c.end_ns - origin.scheduled_ns);
        current_->latency_from_send_ns.Record(c.end_ns - origin.sent_ns);
      } else {
        const std::string code = transport_.CodeName(c.code);
        ++current_->errors[code];
        current_->error_latency_ns[code].Record(c.end_ns - origin.scheduled_ns);
        current_->error_latency_from_send_ns[code].Record(c.end_ns - origin.sent_ns);
      }
    }
    if (!config_.open_loop) Send(clock_.NowNs());
  }

  void Drain() {
    const int64_t deadline = clock_.NowNs() + config_.drain_timeout_ns;
    std::vector<Completion> done;
    while (in_flight_ > 0 && clock_.NowNs() < deadline) {
      done.clear();
      transport_.Wait(deadline, &done);
      in_flight_ -= static_cast<int64_t>(done.size());
      for (const Completion& c : done) free_origins_.push_back(static_cast<uint32_t>(c.tag));
    }
    result_.undrained = in_flight_;
  }

  Transport& transport_;
  const Clock& clock_;
  const StepConfig& config_;
  const Sampler& sampler_;
  StepResult result_;
  std::optional<Window> current_;
  std::optional<ArrivalSchedule> schedule_;
  struct Pending {
    int64_t scheduled_ns;
    bool counted;  // in capacity_waits
  };
  std::deque<Pending> backlog_;
  struct Origin {
    int64_t scheduled_ns;  // open loop: from the schedule; closed loop: the send
    int64_t sent_ns;
  };
  std::vector<Origin> origins_;  // by slot (the transport's tag)
  std::vector<uint32_t> free_origins_;
  int64_t measure_from_ = 0;
  int64_t in_flight_ = 0;
  size_t next_payload_ = 0;
};

}  // namespace

StepResult RunStep(Transport& transport, const Clock& clock, const StepConfig& config,
                   const Sampler& sampler) {
  return StepRunner(transport, clock, config, sampler).Run();
}

}  // namespace shoal::loadgen

#include "loadgen/options.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace shoal::loadgen {
namespace {

std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = text.find(sep, start);
    parts.push_back(text.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

bool ParseInt(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool ParseDouble(std::string_view s, double* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(*out);
}

// START[:END[:STEP]] as three numbers; END defaults to START, STEP to 1.
template <typename T, typename Parse>
StatusOr<std::vector<T>> ParseRange(std::string_view text, const char* what, Parse parse) {
  const auto parts = Split(text, ':');
  if (parts.size() > 3) {
    return InvalidArgument(
        fmt::format("{} range must be START[:END[:STEP]]; was '{}'", what, text));
  }
  T values[3] = {0, 0, 1};
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parse(parts[i], &values[i]) || values[i] <= 0) {
      return InvalidArgument(fmt::format(
          "{} range must be START[:END[:STEP]] of positive numbers; was '{}'", what, text));
    }
  }
  if (parts.size() == 1) values[1] = values[0];
  if (values[1] < values[0]) {
    return InvalidArgument(
        fmt::format("{} range END must not be below START; was '{}'", what, text));
  }
  std::vector<T> out;
  for (int i = 0;; ++i) {
    const T v = static_cast<T>(values[0] + values[2] * i);
    // A small tolerance so 10:30:10 includes 30 with doubles.
    if (static_cast<double>(v) > static_cast<double>(values[1]) * (1 + 1e-9)) break;
    out.push_back(v);
    if (out.size() > 1000) {
      return InvalidArgument(fmt::format("{} range has more than 1000 steps: '{}'", what, text));
    }
  }
  return out;
}

}  // namespace

StatusOr<ShapeOverride> ParseShape(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument(fmt::format(
        "--shape must be NAME:D1,D2,... (dims without the batch axis); was '{}'", text));
  }
  ShapeOverride shape;
  shape.name = std::string(text.substr(0, colon));
  for (std::string_view d : Split(text.substr(colon + 1), ',')) {
    int64_t dim = 0;
    if (!ParseInt(d, &dim) || dim <= 0) {
      return InvalidArgument(
          fmt::format("--shape {}: dims must be positive integers; was '{}'", shape.name, d));
    }
    shape.dims.push_back(dim);
  }
  return shape;
}

StatusOr<std::vector<int64_t>> ParseIntRange(std::string_view text) {
  return ParseRange<int64_t>(text, "--concurrency-range", ParseInt);
}

StatusOr<std::vector<double>> ParseRateRange(std::string_view text) {
  return ParseRange<double>(text, "--request-rate-range", ParseDouble);
}

StatusOr<HostPort> ParseHostPort(std::string_view text, int default_port) {
  HostPort hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return InvalidArgument(fmt::format("-u: unbalanced '[' in '{}'", text));
    }
    hp.host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return InvalidArgument(fmt::format("-u: bad address '{}'", text));
      port_text = text.substr(close + 2);
    }
  } else {
    const size_t colon = text.rfind(':');
    hp.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) port_text = text.substr(colon + 1);
  }
  // Accept and drop a scheme, as users paste URLs.
  for (std::string_view scheme : {"http://", "grpc://"}) {
    if (hp.host.rfind(scheme, 0) == 0) hp.host.erase(0, scheme.size());
  }
  if (hp.host.empty()) return InvalidArgument(fmt::format("-u: no host in '{}'", text));
  hp.port = default_port;
  if (!port_text.empty()) {
    int64_t port = 0;
    if (!ParseInt(port_text, &port) || port <= 0 || port > 65535) {
      return InvalidArgument(fmt::format("-u: port must be 1..65535; was '{}'", port_text));
    }
    hp.port = static_cast<int>(port);
  }
  return hp;
}

Status ValidateBenchOptions(BenchOptions* o) {
  if (o->model.empty()) return InvalidArgument("-m/--model is required");
  if (o->batch_size < 1) {
    return InvalidArgument(fmt::format("-b batch size must be >= 1; was {}", o->batch_size));
  }
  if (!o->concurrency.empty() && !o->request_rates.empty()) {
    return InvalidArgument("give --concurrency-range or --request-rate-range, not both");
  }
  if (o->concurrency.empty() && o->request_rates.empty()) o->concurrency = {1};
  if (o->distribution == Distribution::kBurst) {
    if (o->burst_period_ms <= 0) {
      return InvalidArgument("--burst-period-ms must be positive; was " +
                             std::to_string(o->burst_period_ms));
    }
    if (!(o->burst_on_fraction > 0 && o->burst_on_fraction <= 1)) {
      return InvalidArgument("--burst-on-fraction must be in (0, 1]; was " +
                             std::to_string(o->burst_on_fraction));
    }
  }
  if (o->measurement_interval_ms < 1) {
    return InvalidArgument(
        fmt::format("--measurement-interval must be >= 1 ms; was {}", o->measurement_interval_ms));
  }
  if (o->warmup_ms < 0) {
    return InvalidArgument(fmt::format("--warmup must be >= 0 ms; was {}", o->warmup_ms));
  }
  if (o->max_trials < 1) {
    return InvalidArgument(fmt::format("--max-trials must be >= 1; was {}", o->max_trials));
  }
  if (!(o->stability_percentage > 0)) {
    return InvalidArgument(
        fmt::format("--stability-percentage must be > 0; was {}", o->stability_percentage));
  }
  if (o->percentile && !(*o->percentile > 0 && *o->percentile <= 100)) {
    return InvalidArgument(fmt::format("--percentile must be in (0, 100]; was {}", *o->percentile));
  }
  if (!(o->latency_threshold_ms >= 0)) {
    return InvalidArgument(
        fmt::format("--latency-threshold must be >= 0 ms; was {}", o->latency_threshold_ms));
  }
  if (!(o->late_threshold_us >= 0)) {
    return InvalidArgument(
        fmt::format("--late-threshold-us must be >= 0; was {}", o->late_threshold_us));
  }
  if (o->max_inflight < 1) {
    return InvalidArgument(fmt::format("--max-inflight must be >= 1; was {}", o->max_inflight));
  }
  for (int64_t c : o->concurrency) {
    if (c > 65536) return InvalidArgument(fmt::format("concurrency {} is above 65536", c));
  }
  for (size_t i = 0; i < o->shapes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (o->shapes[i].name == o->shapes[j].name) {
        return InvalidArgument(fmt::format("--shape {} given twice", o->shapes[i].name));
      }
    }
  }
  return Status::Ok();
}

}  // namespace shoal::loadgen

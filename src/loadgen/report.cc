#include "loadgen/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "proto/json_writer.h"

namespace shoal::loadgen {
namespace {

double Us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

std::string FormatPercentile(double p) { return fmt::format("p{:g}", p); }

std::string LoadColumn(const std::vector<StepReport>& steps) {
  return !steps.empty() && steps[0].open_loop ? "Request Rate" : "Concurrency";
}

std::string ErrorsText(const StepReport& s) {
  if (s.errors.empty()) return "0";
  std::string out;
  for (const auto& [name, n] : s.errors)
    out += fmt::format("{}{}: {}", out.empty() ? "" : "; ", name, n);
  return out;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// About `target` round tick steps covering [0, max]: 1, 2 or 5 times a power of ten.
double TickStep(double max, int target) {
  if (!(max > 0)) return 1;
  const double raw = max / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

}  // namespace

std::string LatencyColumnName(const std::optional<double>& percentile) {
  return (percentile ? FormatPercentile(*percentile) : std::string("avg")) + " latency";
}

StepReport Summarize(const StepResult& step, const ReportContext& context) {
  StepReport r;
  r.open_loop = step.config.open_loop;
  r.load = r.open_loop ? step.config.rate_per_s : static_cast<double>(step.config.concurrency);
  r.stable = step.stable;
  r.undrained = step.undrained;
  const size_t n = step.windows.size();
  const size_t first = n > 3 ? n - 3 : 0;
  r.windows = static_cast<int64_t>(n);
  if (n == 0) return r;
  Histogram merged(step.windows[first].latency_ns.highest_trackable_value());
  Histogram from_send(step.windows[first].latency_from_send_ns.highest_trackable_value());
  Histogram send_lag(step.windows[first].send_lag_ns.highest_trackable_value());
  std::map<std::string, Histogram> errors_merged, errors_from_send;
  for (size_t i = first; i < n; ++i) {
    const Window& w = step.windows[i];
    merged.Merge(w.latency_ns);
    from_send.Merge(w.latency_from_send_ns);
    send_lag.Merge(w.send_lag_ns);
    for (const auto& [code, h] : w.error_latency_ns) {
      errors_merged.try_emplace(code, h.highest_trackable_value()).first->second.Merge(h);
    }
    for (const auto& [code, h] : w.error_latency_from_send_ns) {
      errors_from_send.try_emplace(code, h.highest_trackable_value()).first->second.Merge(h);
    }
    r.duration_s += w.duration_s();
    r.requests += w.ok;
    r.sent += w.sent;
    r.late_sends += w.late_sends;
    r.capacity_waits += w.capacity_waits;
    r.max_send_lag_us = std::max(r.max_send_lag_us, Us(w.max_send_lag_ns));
    for (const auto& [name, count] : w.errors) r.errors[name] += count;
  }
  for (const auto& [name, count] : r.errors) r.errors_total += count;
  const double seconds = std::max(r.duration_s, 1e-9);
  r.requests_per_s = static_cast<double>(r.requests) / seconds;
  r.inferences_per_s = r.requests_per_s * static_cast<double>(context.batch_size);
  r.latency_avg_us = merged.mean() / 1000.0;
  r.latency_p50_us = Us(merged.ValueAtPercentile(50));
  r.latency_p90_us = Us(merged.ValueAtPercentile(90));
  r.latency_p95_us = Us(merged.ValueAtPercentile(95));
  r.latency_p99_us = Us(merged.ValueAtPercentile(99));
  r.latency_p999_us = Us(merged.ValueAtPercentile(99.9));
  r.latency_max_us = Us(merged.max());
  r.latency_us = StabilityLatencyNs(merged, context.percentile) / 1000.0;
  for (const auto& [code, h] : errors_merged) {
    if (h.count() == 0) continue;
    r.error_latency[code] = {Us(h.ValueAtPercentile(50)), Us(h.ValueAtPercentile(99)), Us(h.max())};
  }
  for (const auto& [code, h] : errors_from_send) {
    if (h.count() == 0) continue;
    r.error_latency_from_send[code] = {Us(h.ValueAtPercentile(50)), Us(h.ValueAtPercentile(99)),
                                       Us(h.max())};
  }
  r.latency_from_send_p50_us = Us(from_send.ValueAtPercentile(50));
  r.latency_from_send_p99_us = Us(from_send.ValueAtPercentile(99));
  r.latency_from_send_p999_us = Us(from_send.ValueAtPercentile(99.9));
  if (send_lag.count() > 0) {
    r.send_lag_p50_us = Us(send_lag.ValueAtPercentile(50));
    r.send_lag_p99_us = Us(send_lag.ValueAtPercentile(99));
  }
  const int64_t within =
      context.latency_threshold_ms > 0
          ? merged.CountAtOrBelow(static_cast<int64_t>(context.latency_threshold_ms * 1e6))
          : merged.count();
  r.goodput_per_s = static_cast<double>(within) / seconds;
  const int64_t within_from_send =
      context.latency_threshold_ms > 0
          ? from_send.CountAtOrBelow(static_cast<int64_t>(context.latency_threshold_ms * 1e6))
          : from_send.count();
  r.goodput_from_send_per_s = static_cast<double>(within_from_send) / seconds;

  const Sample& start = step.windows[first].start_sample;
  const Sample& end = step.windows[n - 1].end_sample;
  const int64_t completed = r.requests + r.errors_total;
  if (completed > 0) {
    r.client_cpu_us_per_request = Us(end.cpu_ns - start.cpu_ns) / static_cast<double>(completed);
  }
  if (start.server && end.server) {
    const ServerStats d = Subtract(*end.server, *start.server);
    r.server = d;
    r.server_queue_us = d.queue.MeanUs();
    r.server_compute_input_us = d.compute_input.MeanUs();
    r.server_compute_infer_us = d.compute_infer.MeanUs();
    r.server_compute_output_us = d.compute_output.MeanUs();
    r.server_batch_size = d.execution_count == 0 ? 0.0
                                                 : static_cast<double>(d.inference_count) /
                                                       static_cast<double>(d.execution_count);
  }
  return r;
}

std::string FormatTable(const std::vector<StepReport>& steps, const ReportContext& context) {
  std::string out = fmt::format(
      "| {} | infer/s | req/s | goodput/s | p50 us | p90 us | p95 us | p99 us | p99.9 us | max us "
      "| {} us | server queue us | server compute us | errors | late sends | client CPU us/req |\n",
      LoadColumn(steps), LatencyColumnName(context.percentile));
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const StepReport& s : steps) {
    const std::string server_queue =
        s.server ? fmt::format("{:.0f}", s.server_queue_us) : std::string("-");
    const std::string server_compute =
        s.server ? fmt::format("{:.0f}", s.server_compute_input_us + s.server_compute_infer_us +
                                             s.server_compute_output_us)
                 : std::string("-");
    out += fmt::format(
        "| {:g}{} | {:.1f} | {:.1f} | {:.1f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} "
        "| {:.0f} | {} | {} | {} | {} | {:.1f} |\n",
        s.load, s.stable ? "" : " (unstable)", s.inferences_per_s, s.requests_per_s,
        s.goodput_per_s, s.latency_p50_us, s.latency_p90_us, s.latency_p95_us, s.latency_p99_us,
        s.latency_p999_us, s.latency_max_us, s.latency_us, server_queue, server_compute,
        ErrorsText(s), s.late_sends, s.client_cpu_us_per_request);
  }
  return out;
}

std::string FormatCsv(const std::vector<StepReport>& steps, const ReportContext& context) {
  std::string out = LoadColumn(steps) +
                    ",Inferences/Second,Requests/Second,Goodput/Second,Avg latency,p50 latency,"
                    "p90 latency,p95 latency,p99 latency,p99.9 latency,Max latency,"
                    "Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,"
                    "Server Batch Size,Errors,Late Sends,Client CPU us/req,Stable\n";
  for (const StepReport& s : steps) {
    out += fmt::format(
        "{:g},{:.2f},{:.2f},{:.2f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f},"
        "{:.1f},{:.1f},{:.2f},{},{},{:.2f},{}\n",
        s.load, s.inferences_per_s, s.requests_per_s, s.goodput_per_s, s.latency_avg_us,
        s.latency_p50_us, s.latency_p90_us, s.latency_p95_us, s.latency_p99_us, s.latency_p999_us,
        s.latency_max_us, s.server_queue_us, s.server_compute_input_us, s.server_compute_infer_us,
        s.server_compute_output_us, s.server_batch_size, s.errors_total, s.late_sends,
        s.client_cpu_us_per_request, s.stable ? 1 : 0);
  }
  return out;
}

std::string FormatJson(const std::vector<StepReport>& steps, const ReportContext& context) {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginObject();
  w.Member("model", context.model).Member("protocol", context.protocol).Member("url", context.url);
  w.MemberInt("batch_size", context.batch_size);
  w.Member("latency_column", LatencyColumnName(context.percentile));
  w.Key("latency_threshold_ms").Double(context.latency_threshold_ms);
  w.MemberInt("measurement_interval_ms", context.measurement_interval_ms);
  w.Key("steps").BeginArray();
  for (const StepReport& s : steps) {
    w.BeginObject();
    w.Member("mode", s.open_loop ? "request_rate" : "concurrency");
    w.Key(s.open_loop ? "request_rate" : "concurrency").Double(s.load);
    w.MemberInt("windows", s.windows).MemberBool("stable", s.stable);
    w.Key("duration_s").Double(s.duration_s);
    w.MemberInt("requests", s.requests);
    w.Key("requests_per_s").Double(s.requests_per_s);
    w.Key("inferences_per_s").Double(s.inferences_per_s);
    w.Key("goodput_per_s").Double(s.goodput_per_s);
    w.Key("latency_us").BeginObject();
    w.Key("avg").Double(s.latency_avg_us).Key("p50").Double(s.latency_p50_us);
    w.Key("p90").Double(s.latency_p90_us).Key("p95").Double(s.latency_p95_us);
    w.Key("p99").Double(s.latency_p99_us).Key("p99.9").Double(s.latency_p999_us);
    w.Key("max").Double(s.latency_max_us).Key("selected").Double(s.latency_us);
    w.EndObject();
    w.MemberInt("errors_total", s.errors_total);
    w.Key("errors").BeginObject();
    for (const auto& [name, n] : s.errors) w.MemberInt(name, n);
    w.EndObject();
    w.Key("error_latency_us").BeginObject();
    for (const auto& [code, e] : s.error_latency) {
      w.Key(code).BeginObject();
      w.Key("p50").Double(e.p50_us).Key("p99").Double(e.p99_us).Key("max").Double(e.max_us);
      w.EndObject();
    }
    w.EndObject();
    w.Key("error_latency_from_send_us").BeginObject();
    for (const auto& [code, e] : s.error_latency_from_send) {
      w.Key(code).BeginObject();
      w.Key("p50").Double(e.p50_us).Key("p99").Double(e.p99_us).Key("max").Double(e.max_us);
      w.EndObject();
    }
    w.EndObject();
    w.Key("latency_from_send_us").BeginObject();
    w.Key("p50").Double(s.latency_from_send_p50_us).Key("p99").Double(s.latency_from_send_p99_us);
    w.Key("p99.9").Double(s.latency_from_send_p999_us);
    w.EndObject();
    w.Key("goodput_from_send_per_s").Double(s.goodput_from_send_per_s);
    w.Key("send_lag_us").BeginObject();
    w.Key("p50").Double(s.send_lag_p50_us).Key("p99").Double(s.send_lag_p99_us);
    w.Key("max").Double(s.max_send_lag_us);
    w.EndObject();
    w.MemberInt("sent", s.sent).MemberInt("late_sends", s.late_sends);
    w.MemberInt("capacity_waits", s.capacity_waits);
    w.Key("max_send_lag_us").Double(s.max_send_lag_us);
    w.Key("client_cpu_us_per_request").Double(s.client_cpu_us_per_request);
    if (s.server) {
      w.Key("server").BeginObject();
      w.MemberUint("inference_count", s.server->inference_count);
      w.MemberUint("execution_count", s.server->execution_count);
      w.Key("batch_size").Double(s.server_batch_size);
      w.Key("queue_us").Double(s.server_queue_us);
      w.Key("compute_input_us").Double(s.server_compute_input_us);
      w.Key("compute_infer_us").Double(s.server_compute_infer_us);
      w.Key("compute_output_us").Double(s.server_compute_output_us);
      w.EndObject();
    }
    w.EndObject();
  }
  w.EndArray().EndObject();
  out += "\n";
  return out;
}

std::string FormatSvg(const std::vector<StepReport>& steps, const ReportContext& context) {
  constexpr double kWidth = 720, kHeight = 440;
  constexpr double kLeft = 80, kRight = 30, kTop = 50, kBottom = 60;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  double max_x = 0, max_y = 0;
  for (const StepReport& s : steps) {
    max_x = std::max(max_x, s.inferences_per_s);
    max_y = std::max({max_y, s.latency_p50_us / 1000.0, s.latency_p99_us / 1000.0});
  }
  const double step_x = TickStep(max_x, 5), step_y = TickStep(max_y, 5);
  const double top_x = std::max(step_x, std::ceil(max_x / step_x) * step_x);
  const double top_y = std::max(step_y, std::ceil(max_y / step_y) * step_y);
  auto px = [&](double x) { return kLeft + x / top_x * plot_w; };
  auto py = [&](double y) { return kTop + plot_h - y / top_y * plot_h; };

  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      kWidth, kHeight, kWidth / 2,
      XmlEscape(fmt::format("{} over {} (batch {}): latency vs throughput", context.model,
                            context.protocol, context.batch_size)));
  // Grid, ticks and tick labels.
  for (double x = 0; x <= top_x * (1 + 1e-9); x += step_x) {
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:g}</text>\n",
        px(x), kTop, kTop + plot_h, kTop + plot_h + 18, x);
  }
  for (double y = 0; y <= top_y * (1 + 1e-9); y += step_y) {
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
        kLeft, py(y), kLeft + plot_w, kLeft - 8, py(y) + 4, y);
  }
  // Axes and their labels.
  out += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n"
      "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"black\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">throughput (inferences/s)</text>\n"
      "<text x=\"20\" y=\"{6}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {6})\">latency "
      "(ms)</text>\n",
      kLeft, kTop, kTop + plot_h, kLeft + plot_w, kLeft + plot_w / 2, kHeight - 15,
      kTop + plot_h / 2);
  // One polyline per percentile, points marked and labelled with the load.
  struct Line {
    const char* name;
    const char* color;
    double StepReport::*field;
  };
  const Line lines[] = {{"p50", "#1f77b4", &StepReport::latency_p50_us},
                        {"p99", "#d62728", &StepReport::latency_p99_us}};
  int legend = 0;
  for (const Line& line : lines) {
    std::string points;
    for (const StepReport& s : steps) {
      points += fmt::format("{:.1f},{:.1f} ", px(s.inferences_per_s), py(s.*line.field / 1000.0));
    }
    out += fmt::format(
        "<polyline class=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
        line.name, line.color, points);
    for (const StepReport& s : steps) {
      out += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} {:g}: {:.1f} "
          "infer/s, {} {:.3f} ms</title></circle>\n",
          px(s.inferences_per_s), py(s.*line.field / 1000.0), line.color,
          s.open_loop ? "rate" : "concurrency", s.load, s.inferences_per_s, line.name,
          s.*line.field / 1000.0);
    }
    const double ly = kTop + 10 + 18 * legend++;
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"2\"/><text x=\"{4:.1f}\" y=\"{5:.1f}\">{6}</text>\n",
        kLeft + 12, ly, kLeft + 36, line.color, kLeft + 42, ly + 4, line.name);
  }
  for (const StepReport& s : steps) {
    out +=
        fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#555\">{:g}</text>\n",
                    px(s.inferences_per_s) + 5, py(s.latency_p99_us / 1000.0) - 6, s.load);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace shoal::loadgen

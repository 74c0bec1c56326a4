#include "loadgen/bench.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>

#include "loadgen/driver.h"
#include "loadgen/endpoint.h"
#include "loadgen/report.h"

namespace shoal::loadgen {
namespace {

int64_t ProcessCpuNs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ns = [](const timeval& t) { return t.tv_sec * 1'000'000'000LL + t.tv_usec * 1000LL; };
  return ns(u.ru_utime) + ns(u.ru_stime);
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return InvalidArgument(fmt::format("cannot write '{}'", path));
  return Status::Ok();
}

int Fail(std::FILE* err, const Status& s) {
  std::fprintf(err, "shoal bench: %s\n", s.message().c_str());
  return 1;
}

std::string LoadName(const StepConfig& c) {
  return c.open_loop ? fmt::format("request rate {:g}/s", c.rate_per_s)
                     : fmt::format("concurrency {}", c.concurrency);
}

void WarnAboutSchedule(const StepReport& r, const StepConfig& c, std::FILE* err) {
  if (!r.open_loop || r.sent == 0) return;
  if (r.late_sends * 100 > r.sent || r.capacity_waits > 0) {
    std::fprintf(err,
                 "shoal bench: warning: at %s the client could not keep the schedule: %lld of "
                 "%lld sends were more than %.1f ms late (worst %.1f ms), %lld found all %s "
                 "busy. Latencies still run from the scheduled times; raise --max-inflight or "
                 "lower the rate.\n",
                 LoadName(c).c_str(), static_cast<long long>(r.late_sends),
                 static_cast<long long>(r.sent), c.late_threshold_ns / 1e6,
                 r.max_send_lag_us / 1000.0, static_cast<long long>(r.capacity_waits),
                 "in-flight slots");
  }
}

// Samples the client's CPU time and, when the server answers statistics requests (asked
// once here; a note on `err` when it does not), the server's counters for the model.
Sampler MakeSampler(Endpoint& ep, const BenchOptions& o, std::FILE* err) {
  bool server_stats = true;
  if (auto s = ep.GetStats(o.model, o.model_version); !s.ok()) {
    server_stats = false;
    std::fprintf(err, "shoal bench: no server-side statistics (%s)\n",
                 s.status().message().c_str());
  }
  return [&ep, &o, server_stats] {
    Sample sample;
    sample.cpu_ns = ProcessCpuNs();
    if (server_stats) {
      auto s = ep.GetStats(o.model, o.model_version);
      if (s.ok()) sample.server = *s;
    }
    return sample;
  };
}

ReportContext MakeReportContext(const BenchOptions& o, bool grpc, const HostPort& address) {
  ReportContext context;
  context.model = o.model;
  context.protocol = grpc ? "grpc" : "http";
  context.url = fmt::format("{}:{}", address.host, address.port);
  context.batch_size = o.batch_size;
  context.percentile = o.percentile;
  context.latency_threshold_ms = o.latency_threshold_ms;
  context.measurement_interval_ms = o.measurement_interval_ms;
  return context;
}

// "INPUT0 FP32 [1,16], INPUT1 INT32 [1,16]"
std::string DescribeInputs(const std::vector<TensorInfo>& inputs) {
  std::string shapes;
  for (const TensorInfo& t : inputs) {
    shapes += fmt::format("{}{} {} {}", shapes.empty() ? "" : ", ", t.name, t.datatype,
                          FormatShape(t.shape));
  }
  return shapes;
}

// Step `i` of the sweep: the i-th request rate (open loop) or concurrency (closed loop).
StepConfig MakeStepConfig(const BenchOptions& o, bool open_loop, size_t i, size_t payload_count) {
  StepConfig c;
  c.open_loop = open_loop;
  if (open_loop) {
    c.rate_per_s = o.request_rates[i];
  } else {
    c.concurrency = o.concurrency[i];
  }
  c.distribution = o.distribution;
  c.burst_period_ns = o.burst_period_ms * 1'000'000;
  c.burst_on_fraction = o.burst_on_fraction;
  c.seed = o.seed + i;
  c.warmup_ns = o.warmup_ms * 1'000'000;
  c.window_ns = o.measurement_interval_ms * 1'000'000;
  c.max_windows = o.max_trials;
  c.min_windows = std::min<int64_t>(3, o.max_trials);
  c.stability_percentage = o.stability_percentage;
  c.percentile = o.percentile;
  c.late_threshold_ns = o.late_threshold_us * 1000;
  c.payload_count = payload_count;
  return c;
}

// The one-step summary on `err`, with its errors and warnings.
void PrintStep(const StepReport& r, const StepConfig& c, const BenchOptions& o, std::FILE* err) {
  std::fprintf(err, "  %.1f infer/s, %s %.0f us, %lld errors%s\n", r.inferences_per_s,
               LatencyColumnName(o.percentile).c_str(), r.latency_us,
               static_cast<long long>(r.errors_total), r.stable ? "" : " (not stable)");
  for (const auto& [name, n] : r.errors) {
    std::fprintf(err, "  error %s: %lld\n", name.c_str(), static_cast<long long>(n));
  }
  WarnAboutSchedule(r, c, err);
  if (r.undrained > 0) {
    std::fprintf(err, "shoal bench: warning: %lld requests still had no reply after the step\n",
                 static_cast<long long>(r.undrained));
  }
}

// Runs every step of the sweep in order, reporting each on `err`; stops at the first
// step that fails.
StatusOr<std::vector<StepReport>> RunSteps(Transport& transport, const Clock& clock,
                                           const BenchOptions& o, size_t payload_count,
                                           const Sampler& sampler, const ReportContext& context,
                                           std::FILE* err) {
  const bool open_loop = !o.request_rates.empty();
  std::vector<StepReport> reports;
  const size_t steps = open_loop ? o.request_rates.size() : o.concurrency.size();
  for (size_t i = 0; i < steps; ++i) {
    const StepConfig c = MakeStepConfig(o, open_loop, i, payload_count);
    std::fprintf(err, "shoal bench: %s ...\n", LoadName(c).c_str());
    StepResult result = RunStep(transport, clock, c, sampler);
    if (!result.status.ok()) return result.status;
    StepReport r = Summarize(result, context);
    PrintStep(r, c, o, err);
    reports.push_back(std::move(r));
  }
  return reports;
}

// The table on `out`, then the files asked for.
Status WriteReports(const std::vector<StepReport>& reports, const ReportContext& context,
                    const BenchOptions& o, std::FILE* out) {
  std::fputs(FormatTable(reports, context).c_str(), out);
  std::fflush(out);
  if (!o.csv_file.empty()) RETURN_IF_ERROR(WriteFile(o.csv_file, FormatCsv(reports, context)));
  if (!o.json_file.empty()) RETURN_IF_ERROR(WriteFile(o.json_file, FormatJson(reports, context)));
  if (!o.svg_file.empty()) RETURN_IF_ERROR(WriteFile(o.svg_file, FormatSvg(reports, context)));
  return Status::Ok();
}

}  // namespace

int RunBench(BenchOptions o, std::FILE* out, std::FILE* err) {
  if (Status s = ValidateBenchOptions(&o); !s.ok()) return Fail(err, s);
  const bool grpc = o.protocol == Protocol::kGrpc;
  auto address =
      ParseHostPort(o.url.empty() ? std::string("localhost") : o.url, grpc ? 8001 : 8000);
  if (!address.ok()) return Fail(err, address.status());
  auto endpoint = grpc ? NewGrpcEndpoint(*address) : NewHttpEndpoint(*address);
  if (!endpoint.ok()) return Fail(err, endpoint.status());
  Endpoint& ep = **endpoint;

  auto model = ep.GetModelInfo(o.model, o.model_version);
  if (!model.ok()) return Fail(err, model.status());
  auto inputs = ResolveInputs(*model, o.shapes, o.batch_size);
  if (!inputs.ok()) return Fail(err, inputs.status());
  auto payloads =
      MakePayloads(*inputs, o.input_data, model->max_batch_size > 0, o.batch_size, o.seed);
  if (!payloads.ok()) return Fail(err, payloads.status());

  const bool open_loop = !o.request_rates.empty();
  const int64_t capacity =
      open_loop ? o.max_inflight : *std::max_element(o.concurrency.begin(), o.concurrency.end());
  const auto clock = Clock::Real();
  auto transport = ep.NewTransport(*clock, o.model, o.model_version, *payloads, capacity);
  if (!transport.ok()) return Fail(err, transport.status());

  const Sampler sampler = MakeSampler(ep, o, err);
  const ReportContext context = MakeReportContext(o, grpc, *address);
  std::fprintf(err, "shoal bench: %s over %s at %s; inputs: %s\n", o.model.c_str(),
               context.protocol.c_str(), context.url.c_str(), DescribeInputs(*inputs).c_str());
  auto reports = RunSteps(**transport, *clock, o, payloads->size(), sampler, context, err);
  if (!reports.ok()) return Fail(err, reports.status());
  if (Status s = WriteReports(*reports, context, o, out); !s.ok()) return Fail(err, s);
  const bool any_empty = std::any_of(reports->begin(), reports->end(),
                                     [](const StepReport& r) { return r.requests == 0; });
  if (any_empty) {
    std::fprintf(err, "shoal bench: no request succeeded in at least one step\n");
    return 1;
  }
  return 0;
}

}  // namespace shoal::loadgen

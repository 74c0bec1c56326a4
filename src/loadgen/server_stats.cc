#include "loadgen/server_stats.h"

#include <simdjson.h>

namespace shoal::loadgen {
namespace {

uint64_t Sub(uint64_t a, uint64_t b) { return a >= b ? a - b : 0; }

DurationStat Sub(const DurationStat& a, const DurationStat& b) {
  return {Sub(a.count, b.count), Sub(a.ns, b.ns)};
}

uint64_t GetUint(simdjson::dom::element e, std::string_view key) {
  uint64_t v = 0;
  if (e[key].get_uint64().get(v) != simdjson::SUCCESS) return 0;
  return v;
}

void AddDuration(simdjson::dom::element stats, std::string_view key, DurationStat* d) {
  simdjson::dom::element e;
  if (stats[key].get(e) != simdjson::SUCCESS) return;
  d->count += GetUint(e, "count");
  d->ns += GetUint(e, "ns");
}

}  // namespace

ServerStats Subtract(const ServerStats& after, const ServerStats& before) {
  ServerStats d;
  d.inference_count = Sub(after.inference_count, before.inference_count);
  d.execution_count = Sub(after.execution_count, before.execution_count);
  d.success = Sub(after.success, before.success);
  d.queue = Sub(after.queue, before.queue);
  d.compute_input = Sub(after.compute_input, before.compute_input);
  d.compute_infer = Sub(after.compute_infer, before.compute_infer);
  d.compute_output = Sub(after.compute_output, before.compute_output);
  return d;
}

StatusOr<ServerStats> ParseHttpStats(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json.data(), json.size()).get(root) != simdjson::SUCCESS) {
    return InvalidArgument("statistics reply is not JSON");
  }
  simdjson::dom::array versions;
  if (root["model_stats"].get_array().get(versions) != simdjson::SUCCESS) {
    return InvalidArgument("statistics reply has no model_stats array");
  }
  ServerStats s;
  for (simdjson::dom::element v : versions) {
    s.inference_count += GetUint(v, "inference_count");
    s.execution_count += GetUint(v, "execution_count");
    simdjson::dom::element is;
    if (v["inference_stats"].get(is) != simdjson::SUCCESS) continue;
    AddDuration(is, "success", &s.success);
    AddDuration(is, "queue", &s.queue);
    AddDuration(is, "compute_input", &s.compute_input);
    AddDuration(is, "compute_infer", &s.compute_infer);
    AddDuration(is, "compute_output", &s.compute_output);
  }
  return s;
}

}  // namespace shoal::loadgen

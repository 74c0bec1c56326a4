// Runtime benchmark: what the serving core costs and what batching buys, in process.
//
// 1. Overhead per request: the `identity` plugin at concurrency 1, through
//    runtime::Server::Infer and back through the callback (p50, p90, p99 in us), with the
//    caller and the instance thread unpinned, pinned to one core and pinned to two, and
//    the figures that do not depend on the machine's noise: context switches (the
//    process's, voluntary and involuntary) and heap allocations (operator new) per request.
//    Target (issue 17): p50 <= 20 us, p99 <= 100 us.
// 2. The `cost_model` plugin (a = 2 ms, b = 0.1 ms per item, max batch 32) under a
//    closed loop of 64 concurrent callers: one request at a time vs dynamic batching vs
//    dynamic batching with 2 instances; throughput, mean batch size, and throughput as a
//    fraction of what the cost model allows for that configuration.
//    Target: batching >= 0.9 of the bound.
// 3. Ensemble overhead: a one-step ensemble over `identity` vs `identity` called directly,
//    at concurrency 1, measured in alternating rounds so that both see the same noise;
//    what the DAG adds per request (p50, in us). Target: <= 20 us at p50.
//
// Usage: runtime_benchmark [--seconds S] [--requests N]
//                          [--part overhead|batching|ensemble|all]
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/server.h"

namespace fs = std::filesystem;
using namespace shoal;

// Every operator new in the process (the runtime's and the plugins' included) is counted.
static std::atomic<uint64_t> g_allocations{0};

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Not inlined: GCC would then see free() on operator new's pointer and warn.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

int64_t ContextSwitches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

std::string PluginDir() {
  return (fs::read_symlink("/proc/self/exe").parent_path() / ".." / "backends")
      .lexically_normal()
      .string();
}

struct Repo {
  fs::path dir;
  Repo() {
    dir = fs::temp_directory_path() / ("shoal_bench_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir);
  }
  ~Repo() { fs::remove_all(dir); }
  void Add(const std::string& name, const std::string& config) {
    fs::create_directories(dir / name / "1");
    std::ofstream(dir / name / "config.pbtxt") << config;
  }
};

std::unique_ptr<runtime::Server> StartServer(const Repo& repo) {
  runtime::ServerOptions o;
  o.model_repository = repo.dir.string();
  o.backend_directories = {PluginDir()};
  auto s = runtime::Server::Create(o);
  if (!s.ok() || !(*s)->ready()) {
    std::fprintf(stderr, "server failed: %s\n",
                 s.ok() ? "a model failed to load" : s.status().ToString().c_str());
    for (const auto& m : (*s)->RepositoryIndex())
      std::fprintf(stderr, "  %s: %s\n", m.name.c_str(), m.reason.c_str());
    std::exit(1);
  }
  return std::move(s).value();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

runtime::InferRequest FloatRequest(const std::string& model, int64_t cols) {
  runtime::InferRequest r;
  r.model_name = model;
  r.inputs.push_back({"INPUT0", Tensor::Allocate(DataType::kFp32, {1, cols})});
  return r;
}

struct OverheadRow {
  double p50 = 0, p90 = 0, p99 = 0, switches = 0, allocations = 0;
};

// `requests` measured requests (after 1000 unmeasured) to `model`, one at a time, from
// this thread.
OverheadRow MeasureOverhead(runtime::Server& server, const std::string& model, int requests) {
  std::vector<double> us;
  us.reserve(requests);
  std::mutex mu;
  std::condition_variable cv;
  int64_t switches = 0;
  uint64_t allocations = 0;
  for (int i = 0; i < requests + 1000; ++i) {
    if (i == 1000) {
      switches = ContextSwitches();
      allocations = g_allocations.load();
    }
    bool done = false;
    auto req = FloatRequest(model, 16);
    const auto t0 = std::chrono::steady_clock::now();
    server.Infer(std::move(req), [&](runtime::InferResponse r) {
      if (!r.status.ok()) std::abort();
      {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
      }
      // Notified after unlocking: a waiter woken while the lock is still held would only
      // block on it again, adding two context switches that are the client's, not shoal's.
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 1000) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  OverheadRow row;
  row.switches = static_cast<double>(ContextSwitches() - switches) / requests;
  row.allocations = static_cast<double>(g_allocations.load() - allocations) / requests;
  row.p50 = Percentile(us, 0.5);
  row.p90 = Percentile(us, 0.9);
  row.p99 = Percentile(us, 0.99);
  return row;
}

bool PinThisThread(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

void Overhead(int requests) {
  // Three placements of the caller and the instance thread: as the scheduler puts them
  // (unpinned), pinned to one core (each hand-off is a switch on that core), and pinned
  // to two cores (each hand-off wakes a thread on the other core).
  auto config = [](const std::string& name, const std::string& cores) {
    return "name: \"" + name + R"(" backend: "identity" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)" + (cores.empty() ? "" : "instance_group [ { count: 1 cpu_cores: [ " + cores + " ] } ]\n");
  };
  // Only the cores this process may use (under taskset, say), or pinning would fail.
  cpu_set_t original;
  pthread_getaffinity_np(pthread_self(), sizeof(original), &original);
  const bool core0 = CPU_ISSET(0, &original) != 0;
  const bool two_cores = core0 && CPU_ISSET(1, &original) != 0;
  Repo repo;
  repo.Add("identity", config("identity", ""));
  if (core0) repo.Add("identity_core0", config("identity_core0", "0"));
  if (two_cores) repo.Add("identity_core1", config("identity_core1", "1"));
  auto server = StartServer(repo);

  std::printf(
      "## In-process overhead per request (identity, 16 floats, concurrency 1, %d requests)\n\n",
      requests);
  std::printf(
      "| caller and instance thread | p50 us | p90 us | p99 us | context switches | allocations "
      "| target |\n|---|---|---|---|---|---|---|\n");
  auto print = [](const char* label, const OverheadRow& r) {
    std::printf("| %s | %.1f | %.1f | %.1f | %.2f | %.1f | p50 <= 20, p99 <= 100 |\n", label, r.p50,
                r.p90, r.p99, r.switches, r.allocations);
    std::fflush(stdout);
  };
  print("unpinned", MeasureOverhead(*server, "identity", requests));
  if (core0 && PinThisThread(0)) {
    print("both on core 0", MeasureOverhead(*server, "identity_core0", requests));
    if (two_cores) print("core 0 and core 1", MeasureOverhead(*server, "identity_core1", requests));
  }
  pthread_setaffinity_np(pthread_self(), sizeof(original), &original);
  std::printf(
      "\nContext switches and allocations (operator new) are per request, over the whole "
      "process:\nthe client's own included (its request's tensor and callback, its wakeup).\n\n");
}

struct LoopResult {
  double throughput = 0;
  double mean_batch = 0;
  double backend_ms_per_batch = 0;  // mean time inside the backend per execution
  double p50_ms = 0, p99_ms = 0;
};

// `callers` virtual clients, each sending its next request from the previous one's
// callback; measured for `seconds` after a warm-up of a quarter of that.
LoopResult ClosedLoop(runtime::Server& server, const std::string& model, int callers,
                      double seconds) {
  std::atomic<bool> measuring{false}, stopping{false};
  std::atomic<int64_t> completed{0};
  std::atomic<int> outstanding{0};
  std::mutex lat_mu;
  std::vector<double> latencies;
  std::function<void()> send = [&] {
    if (stopping) return;
    ++outstanding;
    const auto t0 = std::chrono::steady_clock::now();
    server.Infer(FloatRequest(model, 1), [&, t0](runtime::InferResponse r) {
      if (!r.status.ok()) {
        std::fprintf(stderr, "request failed: %s\n", r.status.ToString().c_str());
        std::abort();
      }
      if (measuring) {
        ++completed;
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        std::lock_guard<std::mutex> lock(lat_mu);
        latencies.push_back(ms);
      }
      --outstanding;
      send();
    });
  };
  for (int i = 0; i < callers; ++i) send();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds / 4));
  auto mv = *server.GetModel(model);
  const auto before = mv->stats();
  measuring = true;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto after = mv->stats();
  stopping = true;
  while (outstanding > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  LoopResult r;
  r.throughput = static_cast<double>(completed) / elapsed;
  const double execs = static_cast<double>(after.execution_count - before.execution_count);
  r.mean_batch =
      execs > 0 ? static_cast<double>(after.inference_count - before.inference_count) / execs : 0;
  r.backend_ms_per_batch =
      execs > 0 ? static_cast<double>(after.compute_infer.ns - before.compute_infer.ns) / 1e6 /
                      static_cast<double>(after.compute_infer.count - before.compute_infer.count)
                : 0;
  std::lock_guard<std::mutex> lock(lat_mu);
  r.p50_ms = Percentile(latencies, 0.5);
  r.p99_ms = Percentile(latencies, 0.99);
  return r;
}

void Batching(double seconds) {
  const double a_ms = 2.0, b_ms = 0.1;
  const int max_batch = 32, callers = 64;
  struct Config {
    const char* label;
    const char* name;
    std::string config;
    double bound;  // requests/s the cost model allows
  };
  auto cfg = [&](const char* name, bool batching, int instances) {
    std::string c = std::string("name: \"") + name +
                    "\" backend: \"cost_model\" max_batch_size: 32\n" +
                    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
                    "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
                    "parameters { key: \"a_us\" value { string_value: \"2000\" } }\n"
                    "parameters { key: \"b_us\" value { string_value: \"100\" } }\n"
                    "instance_group [ { count: " +
                    std::to_string(instances) + " } ]\n";
    if (batching) c += "dynamic_batching { }\n";
    return c;
  };
  const double one = 1000.0 / (a_ms + b_ms);
  const double full = max_batch * 1000.0 / (a_ms + b_ms * max_batch);
  std::vector<Config> configs = {
      {"one request at a time", "one_at_a_time", cfg("one_at_a_time", false, 1), one},
      {"dynamic batching, 1 instance", "batching", cfg("batching", true, 1), full},
      {"dynamic batching, 2 instances", "batching_2", cfg("batching_2", true, 2), 2 * full},
  };
  Repo repo;
  for (const auto& c : configs) repo.Add(c.name, c.config);
  auto server = StartServer(repo);
  std::printf(
      "## cost_model (a = 2 ms, b = 0.1 ms/item, max batch 32), closed loop, %d callers, %.0f s "
      "each\n\n",
      callers, seconds);
  std::printf(
      "| strategy | req/s | vs one-at-a-time | mean batch | backend ms/batch (model says) | p50 ms "
      "| p99 ms | bound req/s | of bound | of measured-backend bound |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  double base = 0;
  for (const auto& c : configs) {
    const LoopResult r = ClosedLoop(*server, c.name, callers, seconds);
    if (base == 0) base = r.throughput;
    // What the backend allowed as it actually ran: its measured time per batch (the
    // plugin's sleeps overshoot a + b*n when the machine is busy) at the batches formed.
    const int instances = c.bound > full ? 2 : 1;
    const double measured_bound =
        r.backend_ms_per_batch > 0 ? instances * r.mean_batch * 1000.0 / r.backend_ms_per_batch : 0;
    std::printf("| %s | %.0f | %.2fx | %.1f | %.2f (%.2f) | %.2f | %.2f | %.0f | %.2f | %.2f |\n",
                c.label, r.throughput, r.throughput / base, r.mean_batch, r.backend_ms_per_batch,
                a_ms + b_ms * r.mean_batch, r.p50_ms, r.p99_ms, c.bound, r.throughput / c.bound,
                measured_bound > 0 ? r.throughput / measured_bound : 0);
    std::fflush(stdout);
  }
  std::printf(
      "\nTarget: batching >= 0.90 of the bound. \"bound\" assumes full batches (32) that take "
      "exactly\n"
      "a + b*n on instances that never idle; \"measured-backend bound\" uses the backend's "
      "measured time\n"
      "per batch instead, separating the runtime's losses from the plugin's sleep overshoot.\n");
}

void EnsembleOverhead(int requests) {
  Repo repo;
  repo.Add("identity", R"(name: "identity" backend: "identity" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)");
  repo.Add("one_step", R"(name: "one_step" platform: "ensemble" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "identity"
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
)");
  auto server = StartServer(repo);
  // Alternating rounds: both see the same background load (others' builds, say).
  constexpr int kRounds = 5;
  const int per_round = std::max(requests / kRounds, 1000);
  std::vector<OverheadRow> direct, ensemble;
  for (int i = 0; i < kRounds; ++i) {
    direct.push_back(MeasureOverhead(*server, "identity", per_round));
    ensemble.push_back(MeasureOverhead(*server, "one_step", per_round));
  }
  auto median = [](const std::vector<OverheadRow>& rows, double OverheadRow::*field) {
    std::vector<double> v;
    for (const auto& r : rows) v.push_back(r.*field);
    return Percentile(v, 0.5);
  };
  std::printf(
      "## Ensemble overhead (one-step ensemble over identity vs identity, 16 floats, "
      "concurrency 1, %d rounds of %d requests each)\n\n",
      kRounds, per_round);
  std::printf(
      "| model | p50 us | p90 us | p99 us | context switches | allocations |\n"
      "|---|---|---|---|---|---|\n");
  const std::pair<const char*, const std::vector<OverheadRow>*> rows[] = {
      {"identity (direct)", &direct}, {"one_step (ensemble)", &ensemble}};
  for (const auto& [label, r] : rows) {
    std::printf("| %s | %.1f | %.1f | %.1f | %.2f | %.1f |\n", label, median(*r, &OverheadRow::p50),
                median(*r, &OverheadRow::p90), median(*r, &OverheadRow::p99),
                median(*r, &OverheadRow::switches), median(*r, &OverheadRow::allocations));
  }
  std::printf("\nadded by the ensemble: p50 %.1f us (target <= 20 us), p99 %.1f us\n\n",
              median(ensemble, &OverheadRow::p50) - median(direct, &OverheadRow::p50),
              median(ensemble, &OverheadRow::p99) - median(direct, &OverheadRow::p99));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  int requests = 20000;
  std::string part = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    if (a == "--requests") requests = std::atoi(argv[i + 1]);
    if (a == "--part") part = argv[i + 1];
  }
  if (part != "all" && part != "overhead" && part != "batching" && part != "ensemble") {
    std::fprintf(stderr, "--part must be overhead, batching, ensemble or all; was %s\n",
                 part.c_str());
    return 2;
  }
  std::printf("# shoal runtime benchmark (%u CPUs)\n\n", std::thread::hardware_concurrency());
  if (part == "all" || part == "overhead") Overhead(requests);
  if (part == "all" || part == "batching") Batching(seconds);
  if (part == "all" || part == "ensemble") EnsembleOverhead(requests);
  return 0;
}

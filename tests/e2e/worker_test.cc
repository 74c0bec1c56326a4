// `shoal worker` end to end: real workers consume a Redis stream of KServe v2 JSON
// requests from a real redis-server (started here on a loopback port, no persistence).
//
// FailOverAnswersEveryRequestExactlyOnce: three workers, 10,000 requests; one worker is
// killed with SIGKILL while it holds entries. Its entries are claimed by the others after
// the idle time, and every request ends with exactly one result (counted by id in the
// result stream), the right one, none lost, none dead-lettered, nothing left pending.
// The time to reclaim is printed.
//
// Which entries w0 holds when it dies is made exact, not left to timing: w0 is frozen
// (SIGSTOP) and its Redis connections are closed from the server side, so nothing it sent
// is still to run; only then is what the group lists as pending at w0 read, and w0 killed.
// (Observing "w0 holds entries" and then killing it is a race: on a fast run w0 answers
// them, and the stream runs dry, before the signal lands.)
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_wait.h"
#include "server/http_test_client.h"
#include "shoal_process.h"
#include "worker/entry.h"
#include "worker/redis_client.h"
#include "worker/testing/redis_server.h"

namespace shoal::e2e {
namespace {

using shoal::testing::HttpTestClient;
using worker::RedisClient;
using worker::RedisReply;
using worker::testing::RedisTestServer;
using Clock = std::chrono::steady_clock;

constexpr char kIdentityConfig[] = R"(
name: "identity"
backend: "identity"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)";

std::string Payload(int i) {
  return R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[)" +
         std::to_string(i) + "]}]}";
}

// True when process `pid` is stopped (state T in /proc/<pid>/stat): SIGSTOP has landed.
bool Stopped(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t at = stat.rfind(") ");
  return at != std::string::npos && at + 2 < stat.size() && stat[at + 2] == 'T';
}

// The local ports of the TCP connections process `pid` holds to 127.0.0.1:`port`.
std::vector<int> PortsConnectedTo(pid_t pid, int port) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[128] = {};
      const std::string link = fd_dir + "/" + e->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      const std::string t(target, n > 0 ? static_cast<size_t>(n) : 0);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    closedir(d);
  }
  // /proc/net/tcp: "sl local_address rem_address st queues tr retrnsmt uid timeout inode".
  std::vector<int> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
    in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
    if (!inodes.count(inode) || remote.size() < 5 || local.size() < 5) continue;
    if (std::stoi(remote.substr(remote.size() - 4), nullptr, 16) != port) continue;
    out.push_back(std::stoi(local.substr(local.size() - 4), nullptr, 16));
  }
  return out;
}

class WorkerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    redis_ = RedisTestServer::Start(&error);
    ASSERT_NE(redis_, nullptr) << error;
    client_ = redis_->Connect();
    repo_.WriteFile("identity/config.pbtxt", kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
    auto r = client_->Command({"XGROUP", "CREATE", "jobs", "g", "0", "MKSTREAM"});
    ASSERT_TRUE(r.ok() && !r->is_error());
  }

  // Starts a worker named `name`; returns its metrics port.
  int StartWorker(const std::string& name, std::unique_ptr<ShoalProcess>* out) {
    const int metrics = FreePort();
    *out = ShoalProcess::Start({"worker",
                                "--redis",
                                redis_->url(),
                                "--stream",
                                "jobs",
                                "--group",
                                "g",
                                "--consumer",
                                name,
                                "--model-repository",
                                repo_.path(),
                                "--backend-directory",
                                BinaryDir() + "/backends",
                                "--metrics-address",
                                "127.0.0.1",
                                "--metrics-port",
                                std::to_string(metrics),
                                "--claim-idle-ms",
                                "1000",
                                "--claim-interval-ms",
                                "100",
                                "--max-inflight",
                                "64"});
    return metrics;
  }

  void Produce(int begin, int end) {
    std::vector<std::vector<std::string>> batch;
    for (int i = begin; i < end; ++i) {
      batch.push_back({"XADD", "jobs", "*", "id", "req-" + std::to_string(i), "model", "identity",
                       "payload", Payload(i)});
      if (batch.size() == 500 || i + 1 == end) {
        auto r = client_->Pipeline(batch);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        batch.clear();
      }
    }
  }

  // Entries of the stream the group has not read yet, or -1 when Redis cannot tell.
  int64_t GroupLag() {
    auto r = client_->Command({"XINFO", "GROUPS", "jobs"});
    if (!r.ok()) return -1;
    auto info = worker::GroupFromInfoReply(*r, "g");
    return info.ok() ? info->lag : -1;
  }

  // Freezes `w` (SIGSTOP) and closes its Redis connections from the server's side, so
  // that nothing it already sent is still to be executed: what the group lists as pending
  // at `consumer` afterwards is exactly what `w` holds and can never acknowledge. Returns
  // that count; the caller sends SIGCONT to let `w` go on (it reconnects).
  int64_t FreezeAndCut(ShoalProcess* w, const std::string& consumer) {
    w->Signal(SIGSTOP);
    EXPECT_TRUE(WaitUntil([&] { return Stopped(w->pid()); }));
    for (int port : PortsConnectedTo(w->pid(), redis_->port())) {
      // "No such client" is fine: that connection is closed already.
      (void)client_->Command({"CLIENT", "KILL", "ADDR", "127.0.0.1:" + std::to_string(port)});
    }
    return PendingByConsumer()[consumer];
  }

  int64_t Integer(const std::vector<std::string>& argv) {
    auto r = client_->Command(argv);
    return r.ok() && r->type == RedisReply::Type::kInteger ? r->integer : -1;
  }

  // Entries pending at each consumer of the group.
  std::map<std::string, int64_t> PendingByConsumer() {
    std::map<std::string, int64_t> out;
    auto r = client_->Command({"XPENDING", "jobs", "g"});
    if (!r.ok() || !r->is_array() || r->elements.size() < 4) return out;
    for (const RedisReply& c : r->elements[3].elements) {
      out[c.elements[0].str] = std::stoll(c.elements[1].str);
    }
    return out;
  }

  // Every result in the result stream, counted by request id.
  std::map<std::string, int> ResultCounts() {
    std::map<std::string, int> counts;
    std::string start = "-";
    while (true) {
      auto r = client_->Command({"XRANGE", "jobs:results", start, "+", "COUNT", "2000"});
      EXPECT_TRUE(r.ok() && r->is_array());
      if (!r.ok() || r->elements.empty()) break;
      for (const RedisReply& e : r->elements) {
        const RedisReply& f = e.elements[1];
        for (size_t i = 0; i + 1 < f.elements.size(); i += 2) {
          if (f.elements[i].str == "id") ++counts[f.elements[i + 1].str];
        }
      }
      start = "(" + r->elements.back().elements[0].str;
    }
    return counts;
  }

  TempDir repo_;
  std::unique_ptr<RedisTestServer> redis_;
  std::unique_ptr<RedisClient> client_;
};

TEST_F(WorkerE2eTest, FailOverAnswersEveryRequestExactlyOnce) {
  constexpr int kRequests = 10000;
  std::unique_ptr<ShoalProcess> w[3];
  int metrics[3];
  for (int i = 0; i < 3; ++i) metrics[i] = StartWorker("w" + std::to_string(i), &w[i]);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w[i]->WaitForListening(metrics[i])) << w[i]->log();

  const auto start = Clock::now();
  int produced = kRequests;
  Produce(0, produced);
  // Kill w0 while it holds entries (read, not acknowledged): in the middle of its work.
  // It is frozen and cut off from Redis first, so that what it holds is fixed when it is
  // counted; should it hold nothing at that instant, it goes on (with more requests when
  // the stream has run dry) and is frozen again.
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", "jobs:results"}) >= kRequests / 5; }));
  int64_t orphaned = 0;
  int freezes = 0;
  ASSERT_TRUE(WaitUntil(
      [&] {
        if (GroupLag() == 0) {
          Produce(produced, produced + 500);
          produced += 500;
        }
        if (PendingByConsumer()["w0"] == 0) return false;
        ++freezes;
        orphaned = FreezeAndCut(w[0].get(), "w0");
        if (orphaned > 0) return true;
        w[0]->Signal(SIGCONT);
        return false;
      },
      30000))
      << "w0 never held entries when frozen (" << freezes << " tries): " << w[0]->log();
  w[0]->Signal(SIGKILL);
  const auto killed = Clock::now();
  ASSERT_EQ(w[0]->Wait(), -SIGKILL);

  // The survivors claim what w0 held once it is idle for --claim-idle-ms (1000).
  ASSERT_TRUE(WaitUntil([&] { return PendingByConsumer()["w0"] == 0; }, 30000))
      << w[1]->log() << w[2]->log();
  const double reclaim_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
  ASSERT_TRUE(WaitUntil(
      [&] {
        return Integer({"XLEN", "jobs:results"}) >= produced;
      },
      40000))
      << Integer({"XLEN", "jobs:results"}) << "\n"
      << w[1]->log() << w[2]->log();
  const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(WaitUntil([&] { return PendingByConsumer().empty(); }));

  // Exactly one result per request id, and no other.
  const std::map<std::string, int> counts = ResultCounts();
  EXPECT_EQ(counts.size(), static_cast<size_t>(produced));
  int duplicated = 0, missing = 0;
  for (int i = 0; i < produced; ++i) {
    auto it = counts.find("req-" + std::to_string(i));
    if (it == counts.end()) {
      ++missing;
    } else if (it->second != 1) {
      ++duplicated;
    }
  }
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
  EXPECT_EQ(Integer({"XLEN", "jobs:dead"}), 0);

  // Each result is this request's answer.
  std::vector<std::vector<std::string>> gets;
  for (int i = 0; i < produced; ++i) {
    gets.push_back({"HMGET", "jobs:result:req-" + std::to_string(i), "status", "body"});
  }
  auto bodies = client_->Pipeline(gets);
  ASSERT_TRUE(bodies.ok());
  int wrong = 0;
  for (int i = 0; i < produced; ++i) {
    const RedisReply& r = (*bodies)[i];
    const bool ok =
        r.is_array() && r.elements.size() == 2 && r.elements[0].str == "OK" &&
        r.elements[1].str.find("\"id\":\"req-" + std::to_string(i) + "\"") != std::string::npos &&
        r.elements[1].str.find("\"data\":[" + std::to_string(i) + "]") != std::string::npos;
    if (!ok && ++wrong <= 3) ADD_FAILURE() << "req-" << i << ": " << r.elements[1].str;
  }
  EXPECT_EQ(wrong, 0);

  // What the survivors' metrics say: they claimed what w0 left, and answers to requests
  // answered before (by w0, just before it died) were dropped, not stored again.
  double claimed = 0, duplicates = 0;
  for (int i = 1; i < 3; ++i) {
    HttpTestClient scraper("127.0.0.1", metrics[i]);
    claimed += MetricSample(
        scraper, R"(shoal_worker_entries_total{stream="jobs",group="g",source="claimed"})");
    duplicates += MetricSample(
        scraper, R"(shoal_worker_results_total{stream="jobs",group="g",outcome="duplicate"})");
    EXPECT_EQ(MetricSample(scraper,
                           R"(shoal_worker_group_pending_entries{stream="jobs",group="g"})") >= 0,
              true);
  }
  EXPECT_GE(claimed, static_cast<double>(orphaned));
  // The dashboard on the metrics port shows the worker's section with its progress.
  {
    HttpTestClient page("127.0.0.1", metrics[1]);
    const testing::HttpReply data = page.Get("/dashboard/data.json");
    EXPECT_EQ(data.status, 200);
    EXPECT_NE(data.body.find("\"Redis Streams worker\""), std::string::npos) << data.body;
    EXPECT_NE(data.body.find("\"acknowledged\""), std::string::npos) << data.body;
  }
  std::printf(
      "worker fail-over: %d requests, 3 workers, one SIGKILLed holding %lld entries (frozen %d "
      "times to catch it holding some); "
      "reclaimed in %.0f ms (claim idle 1000 ms, claim interval 100 ms); all answered in "
      "%.1f s (%.0f requests/s); %0.f entries claimed, %0.f redelivered answers dropped as "
      "duplicates\n",
      produced, static_cast<long long>(orphaned), freezes, reclaim_ms, total_s, produced / total_s,
      claimed, duplicates);

  for (int i = 1; i < 3; ++i) EXPECT_EQ(w[i]->Terminate(), 0) << w[i]->log();
}

// SIGTERM: the worker stops reading, finishes and acknowledges what it holds, exits 0.
TEST_F(WorkerE2eTest, SigtermFinishesWhatItHoldsAndExitsZero) {
  std::unique_ptr<ShoalProcess> w;
  const int metrics = StartWorker("t0", &w);
  ASSERT_TRUE(w->WaitForListening(metrics)) << w->log();
  // Until t0 is seen holding entries; should it answer all before a poll sees that (the
  // same race as above), more requests are added.
  int produced = 3000;
  Produce(0, produced);
  ASSERT_TRUE(WaitUntil(
      [&] {
        if (PendingByConsumer()["t0"] > 0) return true;
        if (GroupLag() == 0) {
          Produce(produced, produced + 500);
          produced += 500;
        }
        return false;
      },
      10000))
      << w->log();
  EXPECT_EQ(w->Terminate(), 0) << w->log();
  // Nothing it read is left unacknowledged, and everything it acknowledged has a result.
  EXPECT_EQ(PendingByConsumer().count("t0"), 0u);
  auto info = client_->Command({"XINFO", "GROUPS", "jobs"});
  ASSERT_TRUE(info.ok() && info->is_array());
  int64_t read = -1;
  const RedisReply& g = info->elements[0];
  for (size_t i = 0; i + 1 < g.elements.size(); i += 2) {
    if (g.elements[i].str == "entries-read") read = g.elements[i + 1].integer;
  }
  EXPECT_GT(read, 0);
  EXPECT_EQ(Integer({"XLEN", "jobs:results"}), read);
  EXPECT_NE(w->log().find("every entry it ran is answered and acknowledged"), std::string::npos);
}

// The binary form (Triton's binary data extension) in and out, and a malformed payload
// dead-lettered with the parser's reason, through the real KServe codec.
TEST_F(WorkerE2eTest, BinaryPayloadsAndMalformedOnes) {
  std::unique_ptr<ShoalProcess> w;
  const int metrics = StartWorker("b0", &w);
  ASSERT_TRUE(w->WaitForListening(metrics)) << w->log();
  const std::string json = R"({"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32",)"
                           R"("parameters":{"binary_data_size":16}}],)"
                           R"("outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]})";
  const float values[4] = {1.5f, -2.0f, 3.25f, 1e-3f};
  const std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  auto add = client_->Pipeline(
      {{"XADD", "jobs", "*", "id", "bin", "model", "identity", "payload", json + data,
        "header_length", std::to_string(json.size())},
       {"XADD", "jobs", "*", "id", "bad", "model", "identity", "payload",
        R"({"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2]}]})"}});
  ASSERT_TRUE(add.ok());
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", "jobs:results"}) == 2; })) << w->log();

  auto bin = client_->Command({"HMGET", "jobs:result:bin", "status", "header_length", "body"});
  ASSERT_TRUE(bin.ok() && bin->elements.size() == 3);
  EXPECT_EQ(bin->elements[0].str, "OK");
  const std::string& body = bin->elements[2].str;
  const size_t header_length = std::stoul(bin->elements[1].str);
  ASSERT_EQ(body.size(), header_length + sizeof(values)) << body;
  EXPECT_NE(body.find(R"("binary_data_size":16)"), std::string::npos) << body;
  EXPECT_EQ(body.substr(header_length), data);

  auto bad = client_->Command({"HMGET", "jobs:result:bad", "status", "error"});
  ASSERT_TRUE(bad.ok() && bad->elements.size() == 2);
  EXPECT_EQ(bad->elements[0].str, "INVALID_ARGUMENT");
  auto dead = client_->Command({"XRANGE", "jobs:dead", "-", "+"});
  ASSERT_TRUE(dead.ok() && dead->elements.size() == 1);
  const std::string& reason = dead->elements[0].elements[1].elements[1].str;
  EXPECT_EQ(reason.rfind("malformed: ", 0), 0u) << reason;
  EXPECT_NE(reason.find("inputs[0]"), std::string::npos) << reason;
  EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace shoal::e2e

// The worker against a real redis-server (started by the test on a loopback port) and
// an in-process runtime serving the example identity plugin. The payload codec here is
// a small one of the test's own (a number in, the number out): the KServe codec of the
// `shoal` command is covered end to end in tests/e2e/worker_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "runtime/testing/fake_backend.h"
#include "runtime/testing/test_repository.h"
#include "worker/internal/result_script.h"
#include "worker/testing/redis_server.h"
#include "worker/worker.h"

namespace shoal::worker {
namespace {

using runtime::testing::FakeBackendModel;
using runtime::testing::FakeBackendState;
using runtime::testing::TempRepository;

// The runtime's scriptable fake backend (OUTPUT0 = 2 * INPUT0; a negative value fails
// with INTERNAL; a blocked value waits) as a built-in backend called "fake".
class FakeBackend : public backends::Backend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeBackendState> state) : state_(std::move(state)) {}
  std::string name() const override { return "fake"; }
  StatusOr<std::unique_ptr<backends::BackendModel>> LoadModel(const backends::ModelInfo&) override {
    return std::unique_ptr<backends::BackendModel>(new FakeBackendModel(state_));
  }

 private:
  std::shared_ptr<FakeBackendState> state_;
};

constexpr char kFakeConfig[] = R"(
name: "fake"
backend: "fake"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)";

// One request at a time and a queue of two: the third waiting request is refused (429).
constexpr char kTightConfig[] = R"(
name: "tight"
backend: "fake"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { default_queue_policy { max_queue_size: 2 } }
)";
using testing::RedisTestServer;

// Payload: a decimal number v. Request: INPUT0 = [[v]]. Result: OUTPUT0's value, "%g".
class NumberCodec : public PayloadCodec {
 public:
  StatusOr<Decoded> Decode(std::string payload,
                           std::optional<std::string_view> header_length) const override {
    char* end = nullptr;
    const float v = std::strtof(payload.c_str(), &end);
    if (end == payload.c_str() || *end != '\0') return InvalidArgument("payload: not a number");
    Decoded d;
    d.request.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 1}, {v})});
    return d;
  }
  StatusOr<Encoded> Encode(const runtime::InferResponse& response,
                           const std::shared_ptr<const void>&) const override {
    if (response.outputs.empty()) return Internal("no output");
    char text[32];
    std::snprintf(text, sizeof(text), "%g", response.outputs[0].tensor.values<float>()[0]);
    return Encoded{text, std::nullopt};
  }
};

bool WaitUntil(const std::function<bool()>& done, int timeout_ms = 20000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class WorkerRedisTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    redis_ = RedisTestServer::Start(&error).release();
    ASSERT_NE(redis_, nullptr) << error;
    repo_ = new TempRepository("worker_redis_test");
    repo_->AddModel("identity", runtime::testing::kIdentityConfig);
    repo_->AddModel("fake", kFakeConfig);
    repo_->AddModel("tight", kTightConfig);
    fake_ = new std::shared_ptr<FakeBackendState>(std::make_shared<FakeBackendState>());
    runtime::ServerOptions options = runtime::testing::RepositoryOptions(*repo_);
    options.registry = std::make_shared<backends::BackendRegistry>();
    options.registry->Register(std::make_shared<FakeBackend>(*fake_));
    auto server = runtime::Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete fake_;
    delete repo_;
    delete redis_;
  }
  void SetUp() override {
    ASSERT_NE(redis_, nullptr);
    client_ = redis_->Connect();
    stream_ = std::string("s_") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    if (thread_.joinable()) {
      worker_->Stop();
      thread_.join();
    }
  }

  WorkerOptions Options() const {
    WorkerOptions o;
    o.redis = redis_->address();
    o.stream = stream_;
    o.group = "g";
    o.consumer = "w1";
    o.claim_idle_ms = 100;
    o.claim_interval_ms = 20;
    o.block_ms = 20;
    return o;
  }
  void StartWorker(WorkerOptions o) {
    auto w = Worker::Create(std::move(o), server_, std::make_shared<NumberCodec>());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    worker_ = std::move(w).value();
    thread_ = std::thread([this] { worker_->Run(); });
  }
  // Creates the group (at the start of the stream) before anything is added.
  void CreateGroup() {
    auto r = client_->Command({"XGROUP", "CREATE", stream_, "g", "0", "MKSTREAM"});
    ASSERT_TRUE(r.ok() && !r->is_error());
  }
  std::string Add(std::vector<std::string> fields) {
    std::vector<std::string> argv = {"XADD", stream_, "*"};
    argv.insert(argv.end(), fields.begin(), fields.end());
    auto r = client_->Command(argv);
    EXPECT_TRUE(r.ok() && r->is_string());
    return r.ok() ? r->str : "";
  }
  int64_t Integer(std::vector<std::string> argv) {
    auto r = client_->Command(argv);
    return r.ok() && r->type == RedisReply::Type::kInteger ? r->integer : -1;
  }
  std::string HashField(const std::string& key, const std::string& field) {
    auto r = client_->Command({"HGET", key, field});
    return r.ok() && r->is_string() ? r->str : "<nil>";
  }
  int64_t Pending() {
    auto r = client_->Command({"XPENDING", stream_, "g"});
    return r.ok() && r->is_array() ? r->elements[0].integer : -1;
  }
  // Reads `n` entries as another consumer and never acknowledges them: a dead worker.
  void ReadAsGhost(int n) {
    auto r = client_->Command(
        {"XREADGROUP", "GROUP", "g", "ghost", "COUNT", std::to_string(n), "STREAMS", stream_, ">"});
    ASSERT_TRUE(r.ok() && r->is_array());
  }

  static RedisTestServer* redis_;
  static TempRepository* repo_;
  static runtime::Server* server_;
  static std::shared_ptr<FakeBackendState>* fake_;
  std::unique_ptr<RedisClient> client_;
  std::string stream_;
  std::unique_ptr<Worker> worker_;
  std::thread thread_;
};

RedisTestServer* WorkerRedisTest::redis_ = nullptr;
TempRepository* WorkerRedisTest::repo_ = nullptr;
runtime::Server* WorkerRedisTest::server_ = nullptr;
std::shared_ptr<FakeBackendState>* WorkerRedisTest::fake_ = nullptr;

TEST_F(WorkerRedisTest, AnswersEveryRequestOnceAndAcknowledgesIt) {
  CreateGroup();
  constexpr int kRequests = 300;
  for (int i = 0; i < kRequests; ++i) {
    Add({"id", "r" + std::to_string(i), "model", "identity", "payload", std::to_string(i)});
  }
  StartWorker(Options());
  ASSERT_TRUE(WaitUntil([&] {
    return Integer({"XLEN", stream_ + ":results"}) == kRequests;
  })) << Integer({"XLEN", stream_ + ":results"});
  for (int i = 0; i < kRequests; i += 37) {
    const std::string key = stream_ + ":result:r" + std::to_string(i);
    EXPECT_EQ(HashField(key, "status"), "OK");
    EXPECT_EQ(HashField(key, "body"), std::to_string(i));
    EXPECT_GT(Integer({"TTL", key}), 0);
  }
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  // The worker counts an acknowledgement when Redis's reply reaches it, just after Redis
  // (and so this test) can see it.
  ASSERT_TRUE(WaitUntil([&] { return worker_->stats().acked == kRequests; }))
      << worker_->stats().acked;
  const WorkerStats s = worker_->stats();
  EXPECT_EQ(s.read_new, kRequests);
  EXPECT_EQ(s.results_written, kRequests);
  EXPECT_EQ(s.results_duplicate, 0);
  EXPECT_EQ(s.acked, kRequests);
  EXPECT_EQ(Integer({"XLEN", stream_ + ":dead"}), 0);
  // The metrics say the same.
  const std::string metrics = RenderWorkerMetrics(*worker_);
  EXPECT_NE(metrics.find("shoal_worker_results_total{stream=\"" + stream_ +
                         "\",group=\"g\",outcome=\"written\"} 300\n"),
            std::string::npos)
      << metrics;
}

TEST_F(WorkerRedisTest, PoisonEntriesGoToTheDeadLetterStreamWithTheReason) {
  CreateGroup();
  Add({"id", "no-model", "payload", "1"});
  Add({"id", "bad-payload", "model", "identity", "payload", "abc"});
  Add({"id", "unknown-model", "model", "nope", "payload", "1"});
  Add({"model", "identity", "payload", "1"});  // no id: nothing to answer
  Add({"id", "fine", "model", "identity", "payload", "7"});
  StartWorker(Options());
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", stream_ + ":dead"}) == 4; }));
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  EXPECT_EQ(HashField(stream_ + ":result:fine", "body"), "7");
  EXPECT_EQ(HashField(stream_ + ":result:no-model", "status"), "INVALID_ARGUMENT");
  EXPECT_NE(HashField(stream_ + ":result:no-model", "error").find("field 'model': missing"),
            std::string::npos);
  EXPECT_EQ(HashField(stream_ + ":result:bad-payload", "status"), "INVALID_ARGUMENT");
  EXPECT_EQ(HashField(stream_ + ":result:unknown-model", "status"), "NOT_FOUND");
  // Four answers: three errors and one result; the entry without an id has none.
  EXPECT_EQ(Integer({"XLEN", stream_ + ":results"}), 4);

  auto dead = client_->Command({"XRANGE", stream_ + ":dead", "-", "+"});
  ASSERT_TRUE(dead.ok() && dead->is_array());
  std::vector<std::string> reasons;
  for (const RedisReply& e : dead->elements) {
    const RedisReply& f = e.elements[1];
    std::string reason, payload;
    for (size_t i = 0; i + 1 < f.elements.size(); i += 2) {
      if (f.elements[i].str == "dead_reason") reason = f.elements[i + 1].str;
      if (f.elements[i].str == "payload") payload = f.elements[i + 1].str;
    }
    EXPECT_FALSE(payload.empty()) << "the dead letter keeps the entry's own fields";
    reasons.push_back(reason);
  }
  ASSERT_EQ(reasons.size(), 4u);
  EXPECT_NE(reasons[0].find("malformed: field 'model': missing"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[1].find("malformed: payload: not a number"), std::string::npos) << reasons[1];
  EXPECT_NE(reasons[2].find("failed: NOT_FOUND"), std::string::npos) << reasons[2];
  EXPECT_NE(reasons[3].find("malformed: field 'id': missing"), std::string::npos) << reasons[3];
  const WorkerStats s = worker_->stats();
  EXPECT_EQ(s.dead_malformed, 3);
  EXPECT_EQ(s.dead_failed, 1);
}

TEST_F(WorkerRedisTest, EntriesOfADeadConsumerAreClaimedAndAnswered) {
  CreateGroup();
  for (int i = 0; i < 20; ++i) {
    Add({"id", "c" + std::to_string(i), "model", "identity", "payload", std::to_string(i)});
  }
  ReadAsGhost(20);
  ASSERT_EQ(Pending(), 20);
  StartWorker(Options());
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", stream_ + ":results"}) == 20; }));
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  EXPECT_EQ(HashField(stream_ + ":result:c19", "body"), "19");
  EXPECT_EQ(worker_->stats().claimed, 20);
  EXPECT_EQ(worker_->stats().read_new, 0);
}

// A consumer that died after writing the result and before acknowledging: the request is
// claimed, found answered, and acknowledged without a second answer.
TEST_F(WorkerRedisTest, AClaimedRequestThatHasAResultIsOnlyAcknowledged) {
  CreateGroup();
  Add({"id", "dup", "model", "identity", "payload", "5"});
  ReadAsGhost(1);
  auto set = client_->Command({"HSET", stream_ + ":result:dup", "status", "OK", "body", "first"});
  ASSERT_TRUE(set.ok() && !set->is_error());
  StartWorker(Options());
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  EXPECT_EQ(HashField(stream_ + ":result:dup", "body"), "first");
  EXPECT_EQ(Integer({"XLEN", stream_ + ":results"}), 0);
  // Counted when Redis's reply to the acknowledgement arrives, just after Pending() saw it.
  EXPECT_TRUE(WaitUntil([&] { return worker_->stats().acked == 1; })) << worker_->stats().acked;
  EXPECT_EQ(worker_->stats().results_written, 0);
}

TEST_F(WorkerRedisTest, AnEntryDeliveredTooOftenIsDeadLettered) {
  CreateGroup();
  const std::string id = Add({"id", "crashy", "model", "identity", "payload", "1"});
  ReadAsGhost(1);
  // As if three workers had died on it already.
  auto r = client_->Command({"XCLAIM", stream_, "g", "ghost", "0", id, "RETRYCOUNT", "3"});
  ASSERT_TRUE(r.ok() && !r->is_error());
  WorkerOptions o = Options();
  o.max_deliveries = 3;
  StartWorker(o);
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", stream_ + ":dead"}) == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  auto dead = client_->Command({"XRANGE", stream_ + ":dead", "-", "+"});
  ASSERT_TRUE(dead.ok() && dead->elements.size() == 1);
  EXPECT_EQ(dead->elements[0].elements[1].elements[1].str.find("delivered 4 times"), 0u)
      << dead->elements[0].elements[1].elements[1].str;
  EXPECT_EQ(HashField(stream_ + ":result:crashy", "status"), "UNAVAILABLE");
  EXPECT_EQ(worker_->stats().dead_deliveries, 1);
}

// INTERNAL from the backend is transient: the entry stays pending, is claimed again after
// the idle time (here by the same worker), and is dead-lettered on its last delivery.
TEST_F(WorkerRedisTest, TransientFailuresAreRedeliveredThenDeadLettered) {
  CreateGroup();
  Add({"id", "flaky", "model", "fake", "payload", "-1"});
  WorkerOptions o = Options();
  o.max_deliveries = 3;
  StartWorker(o);
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", stream_ + ":dead"}) == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  auto dead = client_->Command({"XRANGE", stream_ + ":dead", "-", "+"});
  ASSERT_TRUE(dead.ok() && dead->elements.size() == 1);
  const std::string reason = dead->elements[0].elements[1].elements[1].str;
  EXPECT_EQ(reason.find("failed: INTERNAL"), 0u) << reason;
  EXPECT_NE(reason.find("(delivery 3)"), std::string::npos) << reason;
  EXPECT_EQ(HashField(stream_ + ":result:flaky", "status"), "INTERNAL");
  const WorkerStats s = worker_->stats();
  EXPECT_EQ(s.retries_later, 2);
  EXPECT_EQ(s.claimed, 2);
  EXPECT_EQ(s.dead_failed, 1);
}

// Stop() while a request runs: Run() returns only once it is answered, stored and
// acknowledged.
TEST_F(WorkerRedisTest, StopFinishesWhatItHoldsBeforeRunReturns) {
  CreateGroup();
  (*fake_)->Block(5);
  Add({"id", "slow", "model", "fake", "payload", "5"});
  StartWorker(Options());
  ASSERT_TRUE((*fake_)->WaitForWaiting(1));
  worker_->Stop();
  EXPECT_EQ(Pending(), 1);
  (*fake_)->Unblock(5);
  thread_.join();
  EXPECT_EQ(Pending(), 0);
  EXPECT_EQ(HashField(stream_ + ":result:slow", "body"), "10");
}

// The runtime refuses what it cannot queue: the worker narrows its window and runs the
// refused requests again here, without a redelivery, until they are answered.
TEST_F(WorkerRedisTest, RefusedRequestsNarrowTheWindowAndRunAgainHere) {
  CreateGroup();
  (*fake_)->Block(101);
  for (int i = 101; i <= 106; ++i) {
    Add({"id", "t" + std::to_string(i), "model", "tight", "payload", std::to_string(i)});
  }
  WorkerOptions o = Options();
  o.claim_idle_ms = 60000;  // nothing is claimed, however slow this machine is
  StartWorker(o);
  // 101 runs (blocked), two wait in the queue, the rest are refused and retried.
  ASSERT_TRUE(WaitUntil([&] { return worker_->stats().retries_here >= 3; }));
  EXPECT_LT(worker_->stats().capacity, 64);
  (*fake_)->Unblock(101);
  ASSERT_TRUE(WaitUntil([&] { return Integer({"XLEN", stream_ + ":results"}) == 6; }));
  ASSERT_TRUE(WaitUntil([&] { return Pending() == 0; }));
  for (int i = 101; i <= 106; ++i) {
    EXPECT_EQ(HashField(stream_ + ":result:t" + std::to_string(i), "body"), std::to_string(2 * i));
  }
  EXPECT_EQ(Integer({"XLEN", stream_ + ":dead"}), 0);
  EXPECT_EQ(worker_->stats().claimed, 0);  // no redelivery
}

// The script that stores results: two answers for one request id leave the first.
TEST_F(WorkerRedisTest, TheResultScriptStoresTheFirstAnswerOnly) {
  CreateGroup();
  const std::string id = Add({"id", "once", "model", "identity", "payload", "1"});
  auto run = [&](const std::string& body) {
    return Integer({"EVAL", internal::kResultScript, "4", stream_ + ":result:once",
                    stream_ + ":results", stream_, stream_ + ":dead", "g", id, "once", "OK", "",
                    body, "", "0", "", "0", "1", "test"});
  };
  EXPECT_EQ(run("one"), 1);
  EXPECT_EQ(run("two"), 0);
  EXPECT_EQ(HashField(stream_ + ":result:once", "body"), "one");
  EXPECT_EQ(Integer({"XLEN", stream_ + ":results"}), 1);
  EXPECT_EQ(Integer({"TTL", stream_ + ":result:once"}), -1);  // ttl 0: kept
}

TEST_F(WorkerRedisTest, ClientLogsInAsAnAclUserAndRefusesAWrongPassword) {
  auto r = client_->Command({"ACL", "SETUSER", "shoal", "on", ">pw", "~*", "&*", "+@all"});
  ASSERT_TRUE(r.ok() && !r->is_error());
  RedisAddress a = redis_->address();
  a.user = "shoal";
  a.password = "pw";
  a.db = 2;
  auto ok = RedisClient::Connect(a, 5000);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  auto who = (*ok)->Command({"ACL", "WHOAMI"});
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->str, "shoal");
  a.password = "wrong";
  auto refused = RedisClient::Connect(a, 5000);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("AUTH"), std::string::npos)
      << refused.status().message();
}

TEST(WorkerCreate, RefusesBadOptionsNamingThem) {
  WorkerOptions o;
  o.stream = "s";
  o.group = "g";
  o.max_inflight = 0;
  auto w =
      Worker::Create(o, reinterpret_cast<runtime::Server*>(8), std::make_shared<NumberCodec>());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(), "max_inflight must be positive; was 0");
  o.max_inflight = 1;
  o.stream = "";
  EXPECT_FALSE(Worker::Create(o, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace shoal::worker

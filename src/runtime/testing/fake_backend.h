// A scriptable in-process backend for runtime tests.
//
// Model signature: INPUT0 FP32 [-1 (batch), -1] -> OUTPUT0 FP32 = 2 * INPUT0.
// Every execution is recorded (instance, batch size, the first value of each row), so
// tests can assert which requests ran together and in what order. Rows whose first
// value is in `block_values` make Execute wait until Unblock(value); a row whose first
// value is negative makes Execute fail. A row whose first value is in `setup_values`
// (MarkSetup) counts as a one-time set-up: the instances' setups() grows by one as its
// execution begins, as an onnx instance's does when it prepares a plan for a new shape.
//
// With set_pipeline_depth(d > 1) its instances pipeline (BackendInstance::Launch and
// Finish), as a GPU instance does: each has a "device" thread that runs what was launched,
// and Execute calls, in order (through the same Execute, so blocking and failing values
// work alike) and calls a launch's on_done after it. The state records the most batches
// launched and not finished at once, and every call that broke the contract (a launch
// beyond the depth, an Execute while depth batches are outstanding, a Finish with none).
// A row whose first value is -2000 or below makes Launch itself fail (nothing launched);
// with set_drop_on_done(true) the device thread never calls on_done (a backend that loses
// its wake-up on an error path).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace shoal::runtime::testing {

struct Execution {
  int instance = 0;
  int64_t batch_size = 0;
  std::vector<float> row_keys;        // first value of each row
  std::string variant;                // the precision tier the batch asked for ("" = default)
  const void* input_data = nullptr;   // the bytes of INPUT0 the backend was handed
  const void* output_data = nullptr;  // the bytes of the OUTPUT0 it allocated
};

class FakeBackendState {
 public:
  void Block(float value) {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_values_.insert(value);
  }
  void MarkSetup(float value) {
    std::lock_guard<std::mutex> lock(mu_);
    setup_values_.insert(value);
  }
  int64_t setups() const {
    std::lock_guard<std::mutex> lock(mu_);
    return setups_;
  }
  void Unblock(float value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocked_values_.erase(value);
    }
    cv_.notify_all();
  }
  // Waits (real time, bounded) until `n` executions are waiting on a blocked value.
  bool WaitForWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return waiting_ == n; });
  }
  bool WaitForExecutions(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return executions_.size() >= n; });
  }
  std::vector<Execution> executions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return executions_;
  }
  int instances_created() const {
    std::lock_guard<std::mutex> lock(mu_);
    return instances_created_;
  }

  Status Execute(int instance, const backends::ExecuteRequest& req,
                 std::vector<NamedTensor>* outputs) {
    const Tensor& in = req.inputs.at(0).tensor;
    const int64_t rows = in.shape()[0];
    const int64_t cols = in.shape().size() > 1 ? in.shape()[1] : 1;
    Execution e{instance, req.batch_size, {}, req.variant, in.data()};
    size_t index = 0;
    for (int64_t r = 0; r < rows; ++r) e.row_keys.push_back(in.values<float>()[r * cols]);
    {
      std::unique_lock<std::mutex> lock(mu_);
      index = executions_.size();
      executions_.push_back(e);
      for (float k : e.row_keys) {
        if (setup_values_.count(k)) {
          ++setups_;
          break;
        }
      }
      cv_.notify_all();
      auto blocked = [&] {
        for (float k : e.row_keys) {
          if (blocked_values_.count(k)) return true;
        }
        return false;
      };
      if (blocked()) {
        ++waiting_;
        cv_.notify_all();
        // Bounded: a test that fails before it unblocks must end, not hang its binary.
        const bool released =
            cv_.wait_for(lock, std::chrono::seconds(60), [&] { return !blocked(); });
        --waiting_;
        if (!released) return Internal("fake backend: still blocked after 60 s");
      }
    }
    for (float k : e.row_keys) {
      // -1000 and below: bad input data (as an engine reports an index out of range);
      // other negatives: a backend failure.
      if (k <= -1000)
        return InvalidArgument("fake backend: value " + std::to_string(k) + " out of range");
      if (k < 0) return Internal("fake backend asked to fail by value " + std::to_string(k));
    }
    Tensor out = Tensor::Allocate(DataType::kFp32, in.shape());
    for (size_t i = 0; i < in.values<float>().size(); ++i)
      out.mutable_values<float>()[i] = 2 * in.values<float>()[i];
    {
      std::lock_guard<std::mutex> lock(mu_);
      executions_[index].output_data = out.data();
    }
    outputs->push_back(NamedTensor{"OUTPUT0", std::move(out)});
    return Status::Ok();
  }

  void CountInstance() {
    std::lock_guard<std::mutex> lock(mu_);
    ++instances_created_;
  }

  // Instances created from now on pipeline `depth` batches (1: they do not).
  void set_pipeline_depth(int depth) {
    std::lock_guard<std::mutex> lock(mu_);
    pipeline_depth_ = depth;
  }
  int pipeline_depth() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pipeline_depth_;
  }
  // A pipelining instance has `n` batches launched and not finished.
  void RecordOutstanding(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    max_outstanding_ = std::max(max_outstanding_, n);
  }
  void set_drop_on_done(bool drop) {
    std::lock_guard<std::mutex> lock(mu_);
    drop_on_done_ = drop;
  }
  bool drop_on_done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return drop_on_done_;
  }
  int max_outstanding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_outstanding_;
  }
  // Its instances' device is lost from now on: device_stats() says so (context_lost), as a
  // GPU instance's does after a sticky CUDA error.
  void LoseDevice() {
    std::lock_guard<std::mutex> lock(mu_);
    device_lost_ = true;
  }
  bool device_lost() const {
    std::lock_guard<std::mutex> lock(mu_);
    return device_lost_;
  }
  void RecordContractBroken(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    contract_broken_.push_back(what);
  }
  std::vector<std::string> contract_broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return contract_broken_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<float> blocked_values_;
  std::set<float> setup_values_;
  int64_t setups_ = 0;
  std::vector<Execution> executions_;
  int waiting_ = 0;
  int instances_created_ = 0;
  int pipeline_depth_ = 1;
  int max_outstanding_ = 0;
  bool drop_on_done_ = false;
  bool device_lost_ = false;
  std::vector<std::string> contract_broken_;
};

class FakeInstance : public backends::BackendInstance {
 public:
  FakeInstance(std::shared_ptr<FakeBackendState> state, int index)
      : state_(std::move(state)), index_(index), depth_(state_->pipeline_depth()) {
    if (depth_ > 1) device_ = std::thread([this] { DeviceLoop(); });
  }
  ~FakeInstance() override {
    if (!device_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    device_.join();
  }

  int pipeline_depth() const override { return depth_; }
  int64_t setups() const override { return state_->setups(); }
  backends::DeviceStats device_stats() const override {
    backends::DeviceStats stats;
    stats.context_lost = state_->device_lost();
    return stats;
  }

  Status Execute(const backends::ExecuteRequest& req, std::vector<NamedTensor>* outputs) override {
    if (depth_ == 1) return state_->Execute(index_, req, outputs);
    if (launched_.size() >= static_cast<size_t>(depth_)) {
      state_->RecordContractBroken("Execute with " + std::to_string(launched_.size()) +
                                   " batches outstanding");
    }
    // Behind what is launched, as a GPU instance queues it on its stream.
    auto work = Queue(req, nullptr);
    Wait(*work);
    for (auto& t : work->outputs) outputs->push_back(std::move(t));
    return work->status;
  }

  Status Launch(const backends::ExecuteRequest& req, std::function<void()> on_done) override {
    if (depth_ == 1 || launched_.size() >= static_cast<size_t>(depth_)) {
      state_->RecordContractBroken("Launch with " + std::to_string(launched_.size()) +
                                   " batches outstanding");
      return FailedPrecondition("fake backend: no room to launch");
    }
    const Tensor& in = req.inputs.at(0).tensor;
    const int64_t cols = in.shape().size() > 1 ? in.shape()[1] : 1;
    for (int64_t r = 0; r < in.shape()[0]; ++r) {
      if (in.values<float>()[r * cols] <= -2000) return Internal("fake backend: launch refused");
    }
    launched_.push_back(Queue(req, std::move(on_done)));
    state_->RecordOutstanding(static_cast<int>(launched_.size()));
    return Status::Ok();
  }

  Status Finish(std::vector<NamedTensor>* outputs) override {
    if (launched_.empty()) {
      state_->RecordContractBroken("Finish with nothing launched");
      return FailedPrecondition("fake backend: nothing launched");
    }
    std::shared_ptr<Work> work = std::move(launched_.front());
    launched_.pop_front();
    Wait(*work);
    for (auto& t : work->outputs) outputs->push_back(std::move(t));
    return work->status;
  }

 private:
  struct Work {
    backends::ExecuteRequest request;
    std::function<void()> on_done;
    bool finished = false;
    Status status;
    std::vector<NamedTensor> outputs;
  };
  std::shared_ptr<Work> Queue(const backends::ExecuteRequest& req, std::function<void()> on_done) {
    auto work = std::make_shared<Work>();
    work->request = req;
    work->on_done = std::move(on_done);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(work);
    }
    cv_.notify_all();
    return work;
  }
  void Wait(const Work& work) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return work.finished; });
  }
  void DeviceLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::shared_ptr<Work> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::vector<NamedTensor> outputs;
      const Status status = state_->Execute(index_, work->request, &outputs);
      lock.lock();
      work->status = status;
      work->outputs = std::move(outputs);
      work->finished = true;
      std::function<void()> on_done = std::move(work->on_done);
      lock.unlock();
      cv_.notify_all();
      // After the batch, like a stream's callback.
      if (on_done && !state_->drop_on_done()) on_done();
      lock.lock();
    }
  }

  std::shared_ptr<FakeBackendState> state_;
  int index_;
  const int depth_;
  // Instance thread only: launched, not yet finished, oldest first.
  std::deque<std::shared_ptr<Work>> launched_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Work>> queue_;  // for the device thread
  bool stopping_ = false;
  std::thread device_;
};

class FakeBackendModel : public backends::BackendModel {
 public:
  explicit FakeBackendModel(std::shared_ptr<FakeBackendState> state, backends::ModelInfo info = {})
      : state_(std::move(state)), info_(std::move(info)) {}
  StatusOr<std::unique_ptr<backends::BackendInstance>> CreateInstance(
      const backends::InstanceInfo& info) override {
    state_->CountInstance();
    return std::unique_ptr<backends::BackendInstance>(new FakeInstance(state_, info.index));
  }
  backends::ModelInfo info() const override { return info_; }

 private:
  std::shared_ptr<FakeBackendState> state_;
  backends::ModelInfo info_;
};

// The fake as a backend a Server loads models with (config `backend: "fake"`), through a
// BackendRegistry the test gives it (ServerOptions::registry); every model shares `state`.
class FakeBackend : public backends::Backend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeBackendState> state) : state_(std::move(state)) {}
  std::string name() const override { return "fake"; }
  StatusOr<std::unique_ptr<backends::BackendModel>> LoadModel(
      const backends::ModelInfo& info) override {
    return std::unique_ptr<backends::BackendModel>(new FakeBackendModel(state_, info));
  }

 private:
  std::shared_ptr<FakeBackendState> state_;
};

}  // namespace shoal::runtime::testing

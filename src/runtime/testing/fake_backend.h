// A scriptable in-process backend for runtime tests.
//
// Model signature: INPUT0 FP32 [-1 (batch), -1] -> OUTPUT0 FP32 = 2 * INPUT0.
// Every execution is recorded (instance, batch size, the first value of each row), so
// tests can assert which requests ran together and in what order. Rows whose first
// value is in `block_values` make Execute wait until Unblock(value); a row whose first
// value is negative makes Execute fail.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
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

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<float> blocked_values_;
  std::vector<Execution> executions_;
  int waiting_ = 0;
  int instances_created_ = 0;
};

class FakeInstance : public backends::BackendInstance {
 public:
  FakeInstance(std::shared_ptr<FakeBackendState> state, int index)
      : state_(std::move(state)), index_(index) {}
  Status Execute(const backends::ExecuteRequest& req, std::vector<NamedTensor>* outputs) override {
    return state_->Execute(index_, req, outputs);
  }

 private:
  std::shared_ptr<FakeBackendState> state_;
  int index_;
};

class FakeBackendModel : public backends::BackendModel {
 public:
  explicit FakeBackendModel(std::shared_ptr<FakeBackendState> state) : state_(std::move(state)) {}
  StatusOr<std::unique_ptr<backends::BackendInstance>> CreateInstance(
      const backends::InstanceInfo& info) override {
    state_->CountInstance();
    return std::unique_ptr<backends::BackendInstance>(new FakeInstance(state_, info.index));
  }
  backends::ModelInfo info() const override { return {}; }

 private:
  std::shared_ptr<FakeBackendState> state_;
};

}  // namespace shoal::runtime::testing

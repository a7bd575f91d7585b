// A deterministic in-process Backend for tests: y = 2 * x + offset, with
// optional per-batch latency and failure, recording every batch it runs.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.h"

namespace serving {
namespace testing {

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(size_t instances = 1, int64_t features = 2)
      : instances_(instances) {
    inputs_ = {{"x", DataType::kFp32, {-1, features}}};
    outputs_ = {{"y", DataType::kFp32, {-1, features}}};
  }

  const std::vector<TensorSpec>& InputSpecs() const override { return inputs_; }
  const std::vector<TensorSpec>& OutputSpecs() const override {
    return outputs_;
  }
  size_t InstanceCount() const override { return instances_; }

  Status Infer(size_t instance, const std::vector<Tensor>& inputs,
               std::vector<Tensor>* outputs) override {
    const int concurrent = ++running_;
    int seen = max_concurrent_.load();
    while (concurrent > seen &&
           !max_concurrent_.compare_exchange_weak(seen, concurrent)) {
    }
    const int64_t latency_ms = latency_ms_.load();
    if (latency_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(latency_ms));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch_sizes_.push_back(inputs[0].shape[0]);
      instances_used_.push_back(instance);
    }
    --running_;
    if (fail_) return Internal("fake backend failure");
    const Tensor& x = inputs[0];
    Tensor y = Tensor::Allocate("y", DataType::kFp32, x.shape);
    const float* in = x.data_as<float>();
    float* out = y.data_as<float>();
    for (int64_t i = 0; i < x.element_count(); ++i)
      out[i] = 2 * in[i] + offset_;
    outputs->clear();
    outputs->push_back(std::move(y));
    return Status::Ok();
  }

  void set_latency(std::chrono::milliseconds latency) {
    latency_ms_ = latency.count();
  }
  void set_fail(bool fail) { fail_ = fail; }
  void set_offset(float offset) { offset_ = offset; }
  std::vector<int64_t> batch_sizes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batch_sizes_;
  }
  int max_concurrent() const { return max_concurrent_; }

 private:
  size_t instances_;
  std::vector<TensorSpec> inputs_;
  std::vector<TensorSpec> outputs_;
  std::atomic<int64_t> latency_ms_{0};
  std::atomic<bool> fail_{false};
  float offset_ = 0.0f;
  std::atomic<int> running_{0};
  std::atomic<int> max_concurrent_{0};
  mutable std::mutex mu_;
  std::vector<int64_t> batch_sizes_;
  std::vector<size_t> instances_used_;
};

// A [batch, features] FP32 tensor filled with `start`, `start + 1`, ...
inline Tensor MakeInput(int64_t batch, int64_t features, float start,
                        const std::string& name = "x") {
  Tensor t = Tensor::Allocate(name, DataType::kFp32, {batch, features});
  float* data = t.data_as<float>();
  for (int64_t i = 0; i < batch * features; ++i)
    data[i] = start + i;
  return t;
}

}  // namespace testing
}  // namespace serving

// Dynamic batcher: requests (each with batch n >= 1 along dim 0) wait in one
// FIFO queue; workers (one per backend instance) form a batch of up to
// max_batch_size samples, or whatever is queued once the oldest request has
// waited max_queue_delay_us, concatenate along dim 0, run it, and split the
// outputs back to their requests. A request is never split across batches.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.h"
#include "status.h"
#include "tensor.h"

namespace serving {

class ServingMetrics;

using Clock = std::chrono::steady_clock;

// One queued request; shared by the caller and the batcher so that a caller
// that gave up (timeout, disconnect) leaves nothing dangling.
class InferJob {
 public:
  InferJob(std::vector<Tensor> inputs, Clock::time_point deadline);

  const std::vector<Tensor>& inputs() const { return inputs_; }
  int64_t batch_size() const { return batch_size_; }
  Clock::time_point enqueue_time() const { return enqueue_time_; }
  Clock::time_point deadline() const { return deadline_; }

  // The caller's side: wait for Complete(), or give up with Cancel().
  std::future<Status> future() { return promise_.get_future(); }
  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Valid after the future is ready with an OK status.
  std::vector<Tensor>& outputs() { return outputs_; }

 private:
  friend class DynamicBatcher;
  void Complete(Status status);
  void set_enqueue_time(Clock::time_point t) { enqueue_time_ = t; }

  std::vector<Tensor> inputs_;
  int64_t batch_size_ = 1;
  Clock::time_point enqueue_time_;
  Clock::time_point deadline_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> completed_{false};
  std::vector<Tensor> outputs_;
  std::promise<Status> promise_;
};

struct BatcherOptions {
  int64_t max_batch_size = 8;
  int64_t max_queue_delay_us = 1000;
  bool dynamic_batching = true;  // false: every request runs alone
};

class DynamicBatcher {
 public:
  // Starts one worker per backend instance. `backend` and `metrics`
  // (nullable) must outlive the batcher.
  static StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const BatcherOptions& options, Backend* backend, ServingMetrics* metrics);
  ~DynamicBatcher();

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues the job; its future completes when it ran (or failed, expired or
  // was cancelled). Errors: batch too large (InvalidArgument), stopped
  // (Unavailable).
  Status Enqueue(std::shared_ptr<InferJob> job);

  // Stops accepting work, runs everything already queued, joins the workers.
  void Stop();

  size_t queue_depth() const;

 private:
  DynamicBatcher(const BatcherOptions& options, Backend* backend,
                 ServingMetrics* metrics);
  void WorkerLoop(size_t instance);
  // Pops the next batch (blocking); empty when stopping with an empty queue.
  std::vector<std::shared_ptr<InferJob>> NextBatch();
  void Execute(size_t instance,
               const std::vector<std::shared_ptr<InferJob>>& batch);

  const BatcherOptions options_;
  Backend* const backend_;
  ServingMetrics* const metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<InferJob>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace serving

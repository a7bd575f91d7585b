// Dynamic batcher: requests (each with batch n >= 1 along dim 0) wait in one
// FIFO queue; workers (one per backend instance) take batches of up to
// max_batch_size samples, concatenate along dim 0, run them, and split the
// outputs back to their requests. A request is never split across batches.
//
// When a worker is free it dispatches at once: a lone request never waits.
// Requests collect while every worker is busy and run as one batch when a
// worker frees up. With max_queue_delay_us > 0 (0 by default), a free worker
// also waits, at most max_queue_delay_us after it became free (or after the
// oldest queued request arrived, if later), while clients it answered a moment ago have not sent their next request
// yet: closed-loop clients (wrk, a load balancer's pool, tritonclient
// threads) come back once answered, and waiting for them turns the
// alternating batches of B and N-B that N clients produce into batches of N.
// "A moment" is four times the time answered clients have been taking to
// come back; until one has come back nobody is expected. A lone client is
// back before its next request is planned, so it never waits. Queued work is
// split evenly across the workers that are free.
#pragma once

#include "defaults.h"
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.h"
#include "status.h"
#include "tensor.h"

namespace serving {

class ModelStats;
class ServingMetrics;

using Clock = std::chrono::steady_clock;

// One queued request; shared by the caller and the batcher so that a caller
// that gave up (timeout, disconnect) leaves nothing dangling.
class InferJob {
 public:
  // Called exactly once with the outputs or the error, on the thread that
  // completes the job (a batcher worker): keep it short, never block in it.
  // The outputs are moved into it (outputs() is empty afterwards).
  using Callback = std::function<void(StatusOr<std::vector<Tensor>>)>;

  InferJob(std::vector<Tensor> inputs, Clock::time_point deadline,
           Callback done = nullptr);

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
  Callback done_;
};

// The deadline of a request queued now: the server's timeout, or the
// request's "timeout" parameter (µs, 0 = none) when that is shorter.
Clock::time_point RequestDeadline(int64_t request_timeout_ms,
                                  int64_t request_timeout_us);

struct BatcherOptions {
  int64_t max_batch_size = kDefaultMaxBatchSize;
  // Longest time a free worker waits for a forming batch (see above).
  int64_t max_queue_delay_us = kDefaultMaxQueueDelayUs;
  bool dynamic_batching = kDefaultDynamicBatching;  // false: each runs alone
  // Requests waiting at most (0: no bound); more are refused (Unavailable).
  int64_t max_queue_size = kDefaultMaxQueueSize;
};

class DynamicBatcher {
 public:
  // Called by each worker on its own thread, with its instance, before it
  // takes work: the runtime's per-thread and per-shape state is then built
  // on the threads that serve (Model's warm-up).
  using WarmFn = std::function<Status(size_t instance)>;

  // Starts one worker per backend instance and returns once each ran `warm`
  // (if given) and waits for work; the first error of `warm` stops them and
  // is returned. `backend`, `metrics` and `stats` (both nullable) must
  // outlive the batcher.
  static StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const BatcherOptions& options, Backend* backend, ServingMetrics* metrics,
      ModelStats* stats = nullptr, const WarmFn& warm = nullptr);
  ~DynamicBatcher();

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues the job; its future completes when it ran (or failed, expired or
  // was cancelled). Errors: batch too large (InvalidArgument), stopped or
  // queue full (Unavailable).
  Status Enqueue(std::shared_ptr<InferJob> job);

  // Stops accepting work, runs everything already queued, joins the workers.
  void Stop();

  size_t queue_depth() const;
  // Jobs queued or running.
  size_t pending() const;

 private:
  DynamicBatcher(const BatcherOptions& options, Backend* backend,
                 ServingMetrics* metrics, ModelStats* stats);
  // Under mu_: how many samples of the queue head a free worker takes now,
  // and whether it should run them now rather than wait for more.
  struct Plan {
    size_t take = 0;
    bool dispatch = false;
    Clock::time_point wake;
  };
  Plan PlanBatch(Clock::time_point now, Clock::time_point free_since) const;
  void Finish(InferJob& job, Status status, Clock::time_point start,
              uint64_t input_ns, uint64_t infer_ns, uint64_t output_ns);
  void WorkerLoop(size_t instance, const WarmFn* warm);
  Status warm_status_;  // the first warm-up error (under mu_)
  // Pops the next batch (blocking); empty when stopping with an empty queue.
  std::vector<std::shared_ptr<InferJob>> NextBatch();
  void Execute(size_t instance,
               const std::vector<std::shared_ptr<InferJob>>& batch);

  const BatcherOptions options_;
  Backend* const backend_;
  ServingMetrics* const metrics_;
  ModelStats* const stats_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<InferJob>> queue_;
  bool stopping_ = false;
  size_t idle_workers_ = 0;  // workers inside NextBatch
  size_t running_jobs_ = 0;
  // Requests answered within the last max_queue_delay_us whose clients have
  // not sent another request since: (time answered, how many), oldest first.
  // Every arrival settles one, oldest first.
  std::deque<std::pair<Clock::time_point, int64_t>> owed_;
  // Moving average of how long an answered client took to come back.
  double return_ns_ = -1.0;  // none seen yet
  // Until when a free worker waits for answered clients to come back: the
  // latest answer still owed plus four typical return times, capped at
  // max_queue_delay_us; `now` or earlier when nobody is expected.
  Clock::time_point ReturnsExpectedUntil(Clock::time_point now) const;
  std::vector<std::thread> workers_;
};

}  // namespace serving

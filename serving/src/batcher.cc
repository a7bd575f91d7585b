#include "batcher.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "logging.h"
#include "metrics.h"
#include "stats.h"

namespace serving {
namespace {

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

uint64_t Nanos(Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d);
  return ns.count() > 0 ? static_cast<uint64_t>(ns.count()) : 0;
}

// Requests can share a batch when every input has the same non-batch dims.
bool Compatible(const InferJob& a, const InferJob& b) {
  if (a.inputs().size() != b.inputs().size()) return false;
  for (size_t i = 0; i < a.inputs().size(); ++i) {
    const Shape& sa = a.inputs()[i].shape;
    const Shape& sb = b.inputs()[i].shape;
    if (sa.size() != sb.size() || sa.empty()) return false;
    if (a.inputs()[i].dtype != b.inputs()[i].dtype) return false;
    for (size_t d = 1; d < sa.size(); ++d) {
      if (sa[d] != sb[d]) return false;
    }
  }
  return true;
}

}  // namespace

Clock::time_point RequestDeadline(int64_t request_timeout_ms,
                                  int64_t request_timeout_us) {
  const auto now = Clock::now();
  auto deadline = now + std::chrono::milliseconds(request_timeout_ms);
  if (request_timeout_us > 0) {
    deadline =
        std::min(deadline, now + std::chrono::microseconds(request_timeout_us));
  }
  return deadline;
}

InferJob::InferJob(std::vector<Tensor> inputs, Clock::time_point deadline,
                   Callback done)
    : inputs_(std::move(inputs)),
      enqueue_time_(Clock::now()),
      deadline_(deadline),
      done_(std::move(done)) {
  if (!inputs_.empty() && !inputs_[0].shape.empty()) {
    batch_size_ = inputs_[0].shape[0];
  }
}

void InferJob::Complete(Status status) {
  bool expected = false;
  if (completed_.compare_exchange_strong(expected, true)) {
    if (done_) {
      Callback done = std::move(done_);
      done_ = nullptr;
      if (status.ok()) {
        done(std::move(outputs_));
      } else {
        done(status);
      }
    }
    promise_.set_value(std::move(status));
  }
}

DynamicBatcher::DynamicBatcher(const BatcherOptions& options, Backend* backend,
                               ServingMetrics* metrics, ModelStats* stats)
    : options_(options), backend_(backend), metrics_(metrics), stats_(stats) {}

StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    const BatcherOptions& options, Backend* backend, ServingMetrics* metrics,
    ModelStats* stats, const WarmFn& warm) {
  if (backend == nullptr) return InvalidArgument("batcher needs a backend");
  if (options.max_batch_size < 1) {
    return InvalidArgument("max batch size must be >= 1");
  }
  if (options.max_queue_delay_us < 0) {
    return InvalidArgument("max queue delay must be >= 0");
  }
  if (options.max_queue_size < 0) {
    return InvalidArgument("max queue size must be >= 0");
  }
  if (backend->InstanceCount() < 1) {
    return InvalidArgument("backend has no execution instance");
  }
  std::unique_ptr<DynamicBatcher> batcher(
      new DynamicBatcher(options, backend, metrics, stats));
  for (size_t i = 0; i < backend->InstanceCount(); ++i) {
    batcher->workers_.emplace_back(&DynamicBatcher::WorkerLoop, batcher.get(),
                                   i, warm ? &warm : nullptr);
  }
  // Ready once every worker waits for work (so the first requests are
  // already split across all of them).
  // (`warm` is read by the workers until then: it outlives their use of it.)
  std::unique_lock<std::mutex> lock(batcher->mu_);
  batcher->cv_.wait(lock, [&] {
    return batcher->idle_workers_ == backend->InstanceCount();
  });
  const Status warmed = batcher->warm_status_;
  lock.unlock();
  if (!warmed.ok()) {
    batcher->Stop();
    return warmed;
  }
  return batcher;
}

DynamicBatcher::~DynamicBatcher() {
  Stop();
}

Status DynamicBatcher::Enqueue(std::shared_ptr<InferJob> job) {
  if (job->batch_size() < 1) {
    return InvalidArgument("batch size must be at least 1");
  }
  if (job->batch_size() > options_.max_batch_size) {
    return InvalidArgument("batch size " + std::to_string(job->batch_size()) +
                           " exceeds the max batch size " +
                           std::to_string(options_.max_batch_size));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Unavailable("server is shutting down");
    if (options_.max_queue_size > 0 &&
        static_cast<int64_t>(queue_.size()) >= options_.max_queue_size) {
      return Unavailable("the queue holds " +
                         std::to_string(options_.max_queue_size) +
                         " requests (--max-queue-size); retry later");
    }
    const auto now = Clock::now();
    const auto window = std::chrono::microseconds(options_.max_queue_delay_us);
    while (!owed_.empty() && owed_.front().first + window < now) {
      owed_.pop_front();
    }
    if (!owed_.empty()) {
      const double back = static_cast<double>(Nanos(now - owed_.front().first));
      return_ns_ = return_ns_ < 0 ? back : 0.8 * return_ns_ + 0.2 * back;
      if (--owed_.front().second == 0) owed_.pop_front();
    }
    job->set_enqueue_time(now);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Status::Ok();
}

void DynamicBatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

size_t DynamicBatcher::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t DynamicBatcher::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + running_jobs_;
}

DynamicBatcher::Plan DynamicBatcher::PlanBatch(
    Clock::time_point now, Clock::time_point free_since) const {
  Plan plan;
  plan.take = 1;
  if (!options_.dynamic_batching) {
    plan.dispatch = true;
    return plan;
  }
  // This worker's share of the queued samples: split evenly across the free
  // workers (all of them wake up for the queue), never above max_batch_size.
  int64_t queued = 0;
  for (const auto& job : queue_) queued += job->batch_size();
  const int64_t free_workers =
      std::max<int64_t>(1, static_cast<int64_t>(idle_workers_));
  const int64_t share = std::min<int64_t>(
      options_.max_batch_size, (queued + free_workers - 1) / free_workers);

  // The longest FIFO prefix of compatible requests within the share.
  int64_t samples = queue_.front()->batch_size();
  bool full = false;
  while (plan.take < queue_.size() && samples < share) {
    const InferJob& next = *queue_[plan.take];
    if (!Compatible(*queue_.front(), next) ||
        samples + next.batch_size() > options_.max_batch_size) {
      full = true;  // waiting longer cannot grow this batch
      break;
    }
    samples += next.batch_size();
    ++plan.take;
  }
  if (samples >= options_.max_batch_size) full = true;
  // The delay counts from when this worker became free, or from the oldest
  // request if it came later: requests that queued during the last execution
  // may wait for the clients answered by it.
  const auto flush_at = std::max(queue_.front()->enqueue_time(), free_since) +
                        std::chrono::microseconds(options_.max_queue_delay_us);
  if (full || stopping_ || free_workers > 1 || now >= flush_at) {
    plan.dispatch = true;
    return plan;
  }
  // Only this worker is free, the batch is not full and the delay has not
  // passed: wait while clients answered a moment ago have not come back yet.
  const auto returns_until = ReturnsExpectedUntil(now);
  if (returns_until > now) {
    plan.wake = std::min(flush_at, returns_until);  // or on an arrival
  } else {
    plan.dispatch = true;
  }
  return plan;
}

Clock::time_point DynamicBatcher::ReturnsExpectedUntil(
    Clock::time_point now) const {
  if (owed_.empty() || return_ns_ < 0) return now;
  const auto patience = std::min<Clock::duration>(
      std::chrono::microseconds(options_.max_queue_delay_us),
      std::chrono::nanoseconds(static_cast<int64_t>(4 * return_ns_)));
  return owed_.back().first + patience;
}

std::vector<std::shared_ptr<InferJob>> DynamicBatcher::NextBatch() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto free_since = Clock::now();
  ++idle_workers_;
  cv_.notify_all();  // Create() waits for every worker to get here
  for (;;) {
    // Requests whose caller gave up or whose deadline passed never run; they
    // are completed outside the lock (their callbacks may enqueue).
    const auto now = Clock::now();
    std::vector<std::shared_ptr<InferJob>> expired;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled() || (*it)->deadline() <= now) {
        expired.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (!expired.empty()) {
      lock.unlock();
      for (auto& job : expired) {
        if (stats_ != nullptr) {
          stats_->RecordFailure(Nanos(now - job->enqueue_time()));
        }
        job->Complete(DeadlineExceeded("request timed out in the queue"));
      }
      lock.lock();
      continue;
    }
    if (queue_.empty()) {
      if (stopping_) {
        --idle_workers_;
        return {};
      }
      cv_.wait(lock);
      continue;
    }
    const Plan plan = PlanBatch(now, free_since);
    if (plan.dispatch) {
      std::vector<std::shared_ptr<InferJob>> batch(
          queue_.begin(), queue_.begin() + static_cast<long>(plan.take));
      queue_.erase(queue_.begin(),
                   queue_.begin() + static_cast<long>(plan.take));
      --idle_workers_;
      running_jobs_ += batch.size();
      if (!queue_.empty()) cv_.notify_all();
      return batch;
    }
    // Wake when the answered clients are overdue, at the delay, at the first
    // deadline, or on a new request.
    auto wake = plan.wake;
    for (const auto& job : queue_) {
      if (job->deadline() < wake) wake = job->deadline();
    }
    cv_.wait_until(lock, wake);
  }
}

void DynamicBatcher::WorkerLoop(size_t instance, const WarmFn* warm) {
  if (warm != nullptr) {
    const Status status = (*warm)(instance);
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (warm_status_.ok()) warm_status_ = status;
    }
  }
  for (;;) {
    auto batch = NextBatch();
    if (batch.empty()) return;
    Execute(instance, batch);
    std::lock_guard<std::mutex> lock(mu_);
    running_jobs_ -= batch.size();
  }
}

void DynamicBatcher::Finish(InferJob& job, Status status,
                            Clock::time_point start, uint64_t input_ns,
                            uint64_t infer_ns, uint64_t output_ns) {
  const auto now = Clock::now();
  if (status.ok() && now > job.deadline()) {
    status = DeadlineExceeded(
        "inference finished after the request's deadline; result discarded");
  }
  if (stats_ != nullptr) {
    const uint64_t total = Nanos(now - job.enqueue_time());
    if (status.ok()) {
      stats_->RecordSuccess(total, Nanos(start - job.enqueue_time()), input_ns,
                            infer_ns, output_ns);
    } else {
      stats_->RecordFailure(total);
    }
  }
  job.Complete(std::move(status));
}

void DynamicBatcher::Execute(
    size_t instance, const std::vector<std::shared_ptr<InferJob>>& batch) {
  const auto start = Clock::now();
  int64_t total = 0;
  for (const auto& job : batch) {
    total += job->batch_size();
    if (metrics_ != nullptr) {
      metrics_->RecordQueueTime(Seconds(start - job->enqueue_time()));
    }
  }

  // Concatenate along dim 0 (a lone request is passed as is).
  std::vector<Tensor> merged;
  const std::vector<Tensor>* inputs = &batch.front()->inputs();
  if (batch.size() > 1) {
    for (const Tensor& first : batch.front()->inputs()) {
      Tensor tensor;
      tensor.name = first.name;
      tensor.dtype = first.dtype;
      tensor.shape = first.shape;
      tensor.shape[0] = total;
      merged.push_back(std::move(tensor));
    }
    for (size_t i = 0; i < merged.size(); ++i) {
      size_t bytes = 0;
      for (const auto& job : batch)
        bytes += job->inputs()[i].data.size();
      merged[i].data.reserve(bytes);
      for (const auto& job : batch) {
        const auto& data = job->inputs()[i].data;
        merged[i].data.insert(merged[i].data.end(), data.begin(), data.end());
      }
    }
    inputs = &merged;
  }

  const auto infer_start = Clock::now();
  std::vector<Tensor> outputs;
  Status status;
  try {
    status = backend_->Infer(instance, *inputs, &outputs);
  } catch (const std::exception& e) {
    status = Internal(std::string("backend threw: ") + e.what());
  }
  const auto infer_end = Clock::now();
  const double compute_seconds = Seconds(infer_end - start);
  if (status.ok()) {
    for (const Tensor& out : outputs) {
      if (out.shape.empty() || out.shape[0] != total ||
          (total > 0 && out.data.size() % static_cast<size_t>(total) != 0)) {
        status = Internal("backend output '" + out.name + "' has shape " +
                          ShapeToString(out.shape) + ", expected batch dim " +
                          std::to_string(total));
        break;
      }
    }
  }
  if (metrics_ != nullptr) {
    metrics_->RecordBatch(total, batch.size(), compute_seconds);
  }
  LogDebug("batch executed", {{"instance", instance},
                              {"requests", batch.size()},
                              {"samples", total},
                              {"compute_ms", compute_seconds * 1e3},
                              {"ok", status.ok()}});
  const uint64_t input_ns = Nanos(infer_start - start);
  const uint64_t infer_ns = Nanos(infer_end - infer_start);
  if (!status.ok()) {
    LogError("inference failed", {{"error", status.message()}});
    for (const auto& job : batch) Finish(*job, status, start, 0, 0, 0);
    return;
  }

  // Split every output back along dim 0, in queue order.
  std::vector<std::vector<Tensor>> parts(batch.size());
  if (batch.size() == 1) {
    parts[0] = std::move(outputs);
  } else {
    int64_t offset = 0;
    for (size_t j = 0; j < batch.size(); ++j) {
      const int64_t n = batch[j]->batch_size();
      for (const Tensor& out : outputs) {
        const size_t per_sample = out.data.size() / static_cast<size_t>(total);
        Tensor part;
        part.name = out.name;
        part.dtype = out.dtype;
        part.shape = out.shape;
        part.shape[0] = n;
        const char* begin =
            out.data.data() + static_cast<size_t>(offset) * per_sample;
        part.data.assign(begin, begin + static_cast<size_t>(n) * per_sample);
        parts[j].push_back(std::move(part));
      }
      offset += n;
    }
  }
  const uint64_t output_ns = Nanos(Clock::now() - infer_end);
  if (stats_ != nullptr) {
    stats_->RecordExecution(total, input_ns, infer_ns, output_ns);
  }
  if (options_.max_queue_delay_us > 0) {
    // Before the answers leave: a client may be back before Finish returns.
    std::lock_guard<std::mutex> lock(mu_);
    owed_.emplace_back(Clock::now(), static_cast<int64_t>(batch.size()));
  }
  for (size_t j = 0; j < batch.size(); ++j) {
    batch[j]->outputs_ = std::move(parts[j]);
    Finish(*batch[j], Status::Ok(), start, input_ns, infer_ns, output_ns);
  }
}

}  // namespace serving

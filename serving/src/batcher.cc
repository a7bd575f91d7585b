#include "batcher.h"

#include <cstring>
#include <exception>
#include <utility>

#include "logging.h"
#include "metrics.h"

namespace serving {
namespace {

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
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

InferJob::InferJob(std::vector<Tensor> inputs, Clock::time_point deadline)
    : inputs_(std::move(inputs)),
      enqueue_time_(Clock::now()),
      deadline_(deadline) {
  if (!inputs_.empty() && !inputs_[0].shape.empty()) {
    batch_size_ = inputs_[0].shape[0];
  }
}

void InferJob::Complete(Status status) {
  bool expected = false;
  if (completed_.compare_exchange_strong(expected, true)) {
    promise_.set_value(std::move(status));
  }
}

DynamicBatcher::DynamicBatcher(const BatcherOptions& options, Backend* backend,
                               ServingMetrics* metrics)
    : options_(options), backend_(backend), metrics_(metrics) {}

StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    const BatcherOptions& options, Backend* backend, ServingMetrics* metrics) {
  if (backend == nullptr) return InvalidArgument("batcher needs a backend");
  if (options.max_batch_size < 1) {
    return InvalidArgument("max batch size must be >= 1");
  }
  if (options.max_queue_delay_us < 0) {
    return InvalidArgument("max queue delay must be >= 0");
  }
  if (backend->InstanceCount() < 1) {
    return InvalidArgument("backend has no execution instance");
  }
  std::unique_ptr<DynamicBatcher> batcher(
      new DynamicBatcher(options, backend, metrics));
  for (size_t i = 0; i < backend->InstanceCount(); ++i) {
    batcher->workers_.emplace_back(&DynamicBatcher::WorkerLoop, batcher.get(),
                                   i);
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
    job->set_enqueue_time(Clock::now());
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

std::vector<std::shared_ptr<InferJob>> DynamicBatcher::NextBatch() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Requests whose caller gave up or whose deadline passed never run.
    const auto now = Clock::now();
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled() || (*it)->deadline() <= now) {
        (*it)->Complete(DeadlineExceeded("request timed out in the queue"));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (queue_.empty()) {
      if (stopping_) return {};
      cv_.wait(lock);
      continue;
    }

    // The longest FIFO prefix that fits in one batch.
    size_t take = 1;
    int64_t samples = queue_.front()->batch_size();
    bool full = !options_.dynamic_batching;
    if (options_.dynamic_batching) {
      while (take < queue_.size()) {
        const InferJob& next = *queue_[take];
        if (!Compatible(*queue_.front(), next) ||
            samples + next.batch_size() > options_.max_batch_size) {
          full = true;  // waiting longer cannot grow this batch
          break;
        }
        samples += next.batch_size();
        ++take;
      }
      if (samples >= options_.max_batch_size) full = true;
    }
    const auto flush_at =
        queue_.front()->enqueue_time() +
        std::chrono::microseconds(options_.max_queue_delay_us);
    if (full || stopping_ || now >= flush_at) {
      std::vector<std::shared_ptr<InferJob>> batch(
          queue_.begin(), queue_.begin() + static_cast<long>(take));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(take));
      if (!queue_.empty()) cv_.notify_all();
      return batch;
    }
    // Wake at the flush time, at the first deadline, or on a new request.
    auto wake = flush_at;
    for (const auto& job : queue_) {
      if (job->deadline() < wake) wake = job->deadline();
    }
    cv_.wait_until(lock, wake);
  }
}

void DynamicBatcher::WorkerLoop(size_t instance) {
  for (;;) {
    auto batch = NextBatch();
    if (batch.empty()) return;
    Execute(instance, batch);
  }
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

  std::vector<Tensor> outputs;
  Status status;
  try {
    status = backend_->Infer(instance, *inputs, &outputs);
  } catch (const std::exception& e) {
    status = Internal(std::string("backend threw: ") + e.what());
  }
  const double compute_seconds = Seconds(Clock::now() - start);
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
  if (!status.ok()) {
    LogError("inference failed", {{"error", status.message()}});
    for (const auto& job : batch)
      job->Complete(status);
    return;
  }

  if (batch.size() == 1) {
    batch.front()->outputs_ = std::move(outputs);
    batch.front()->Complete(Status::Ok());
    return;
  }
  // Split every output back along dim 0, in queue order.
  int64_t offset = 0;
  for (const auto& job : batch) {
    const int64_t n = job->batch_size();
    job->outputs_.clear();
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
      job->outputs_.push_back(std::move(part));
    }
    offset += n;
    job->Complete(Status::Ok());
  }
}

}  // namespace serving

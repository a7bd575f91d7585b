// Per-model inference statistics in the shape of Triton's statistics
// extension (GET v2/models[/{name}[/versions/{v}]]/stats): request counts and
// cumulative queue / compute times, plus one entry per executed batch size.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace serving {

// {count, ns}: how many times and how long in total.
struct StatDuration {
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> ns{0};
  void Add(uint64_t nanoseconds, uint64_t times = 1);
  nlohmann::json Json() const;
};

class ModelStats {
 public:
  // A request that produced its outputs: `total_ns` from enqueue to the end,
  // and its share of the batch it ran in.
  void RecordSuccess(uint64_t total_ns, uint64_t queue_ns, uint64_t input_ns,
                     uint64_t infer_ns, uint64_t output_ns);
  // A request that failed after it was accepted (backend error, timeout).
  void RecordFailure(uint64_t total_ns);
  // One executed batch of `batch_size` samples.
  void RecordExecution(int64_t batch_size, uint64_t input_ns, uint64_t infer_ns,
                       uint64_t output_ns);

  uint64_t inference_count() const { return inference_count_.load(); }
  uint64_t execution_count() const { return execution_count_.load(); }
  uint64_t success_count() const { return success_.count.load(); }
  uint64_t failure_count() const { return fail_.count.load(); }

  // One element of "model_stats".
  nlohmann::json Json(const std::string& name, const std::string& version) const;

 private:
  std::atomic<uint64_t> last_inference_ms_{0};  // ms since the epoch
  std::atomic<uint64_t> inference_count_{0};    // samples
  std::atomic<uint64_t> execution_count_{0};    // batches
  StatDuration success_, fail_, queue_, compute_input_, compute_infer_,
      compute_output_;
  struct BatchStat {
    StatDuration input, infer, output;
  };
  mutable std::mutex mu_;
  std::map<int64_t, BatchStat> batches_;  // by batch size
};

}  // namespace serving

#include "stats.h"

#include <chrono>

namespace serving {

void StatDuration::Add(uint64_t nanoseconds, uint64_t times) {
  count.fetch_add(times, std::memory_order_relaxed);
  ns.fetch_add(nanoseconds, std::memory_order_relaxed);
}

nlohmann::json StatDuration::Json() const {
  return {{"count", count.load()}, {"ns", ns.load()}};
}

void ModelStats::RecordSuccess(uint64_t total_ns, uint64_t queue_ns,
                               uint64_t input_ns, uint64_t infer_ns,
                               uint64_t output_ns) {
  success_.Add(total_ns);
  queue_.Add(queue_ns);
  compute_input_.Add(input_ns);
  compute_infer_.Add(infer_ns);
  compute_output_.Add(output_ns);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  last_inference_ms_.store(static_cast<uint64_t>(now.count()));
}

void ModelStats::RecordFailure(uint64_t total_ns) {
  fail_.Add(total_ns);
}

void ModelStats::RecordExecution(int64_t batch_size, uint64_t input_ns,
                                 uint64_t infer_ns, uint64_t output_ns) {
  inference_count_.fetch_add(static_cast<uint64_t>(batch_size));
  execution_count_.fetch_add(1);
  std::lock_guard<std::mutex> lock(mu_);
  BatchStat& stat = batches_[batch_size];
  stat.input.Add(input_ns);
  stat.infer.Add(infer_ns);
  stat.output.Add(output_ns);
}

nlohmann::json ModelStats::Json(const std::string& name,
                                const std::string& version) const {
  const nlohmann::json zero = {{"count", 0}, {"ns", 0}};
  nlohmann::json batch_stats = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [size, stat] : batches_) {
      batch_stats.push_back({{"batch_size", size},
                             {"compute_input", stat.input.Json()},
                             {"compute_infer", stat.infer.Json()},
                             {"compute_output", stat.output.Json()}});
    }
  }
  return {{"name", name},
          {"version", version},
          {"last_inference", last_inference_ms_.load()},
          {"inference_count", inference_count_.load()},
          {"execution_count", execution_count_.load()},
          {"inference_stats",
           {{"success", success_.Json()},
            {"fail", fail_.Json()},
            {"queue", queue_.Json()},
            {"compute_input", compute_input_.Json()},
            {"compute_infer", compute_infer_.Json()},
            {"compute_output", compute_output_.Json()},
            {"cache_hit", zero},
            {"cache_miss", zero}}},
          {"batch_stats", batch_stats}};
}

}  // namespace serving

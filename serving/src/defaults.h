// The server's built-in defaults for the per-model settings, defined once:
// ServerConfig (flags), BatcherOptions, BackendOptions and ModelIO all start
// from these. A model's model_config.json, then SERVING_* environment
// variables, then flags override them.
#pragma once

#include <cstdint>

namespace serving {

inline constexpr int64_t kDefaultMaxBatchSize = 32;
inline constexpr int64_t kDefaultMaxQueueDelayUs = 0;
inline constexpr int64_t kDefaultMaxQueueSize = 4096;  // 0: unbounded
inline constexpr int kDefaultWorkers = 1;
inline constexpr int kDefaultThreadsPerWorker = 0;  // 0: runtime default
// The share of requests whose inputs the prediction log keeps (0..1).
inline constexpr double kDefaultLogInputRate = 0.0;

}  // namespace serving

// Server configuration from command-line flags, environment variables and the
// model's own model_config.json. Every flag --foo-bar is also read from
// SERVING_FOO_BAR; flags win. KServe's PORT, MODEL_DIR and MODEL_NAME are
// honoured after the SERVING_* names. The per-model settings (batching,
// workers, threads, queue, timeouts, precision: PerModelSettings()) come from
// <model_dir>/model_config.json when neither a flag nor its variable sets them:
// flag > environment > model_config.json > built-in default (defaults.h).
#pragma once

#include "defaults.h"
#include <nlohmann/json.hpp>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "status.h"

namespace serving {

struct ServerConfig {
  // Model.
  std::string model_dir = "/mnt/models";
  std::string model_name;  // empty: signature task + "-classifier"
  std::string model_version = "1";
  std::string variant = "fp32";  // fp32 | int8
  std::string model_file;        // overrides the signature's program
  std::string params_file;       // paddle backend weights override
  std::string backend = "openvino";
  std::string device = "CPU";
  std::string precision = kDefaultPrecision;  // kPrecisionValues
  bool cpu_pinning = kDefaultCpuPinning;  // OpenVINO CPU: pin inference threads
  bool paddle_tensorrt = false;
  int gpu_memory_mb = 512;
  // Execution.
  int workers = kDefaultWorkers;
  int threads_per_worker = kDefaultThreadsPerWorker;
  int64_t max_batch_size = kDefaultMaxBatchSize;
  int64_t max_queue_delay_us = kDefaultMaxQueueDelayUs;
  bool dynamic_batching = kDefaultDynamicBatching;
  int64_t max_queue_size = kDefaultMaxQueueSize;
  int64_t request_timeout_ms = kDefaultRequestTimeoutMs;
  bool model_control = false;  // repository load/unload allowed
  // HTTP (and gRPC).
  std::string host = "0.0.0.0";
  int port = 8080;
  int grpc_port = 8081;  // 0: any free port, -1: no gRPC
  int http_threads = 2;  // event-loop (I/O) threads
  int max_connections = 8192;
  int64_t header_timeout_ms = 10000;
  int64_t body_timeout_ms = 60000;
  int64_t max_body_bytes = 64ll << 20;
  // After a 413 the server drains the refused body (nginx's lingering close)
  // at most this many bytes and this long, so the client reads the answer.
  int64_t lingering_close_bytes = 128ll << 20;
  int64_t lingering_close_ms = 30000;
  int keep_alive_max_count = 1000;
  int keep_alive_timeout_s = 30;
  int64_t drain_delay_ms = 0;
  // Prediction log (prediction_log.h): off unless a directory is given.
  std::string prediction_log_dir;
  int64_t prediction_log_max_bytes = 1ll << 30;
  int64_t prediction_log_segment_bytes = 64ll << 20;
  int64_t prediction_log_queue_size = 8192;
  std::string prediction_log_sink;
  double log_input_rate = kDefaultLogInputRate;  // per model
  // A challenger beside the model from the start (ModelRepository::
  // LoadConfiguredChallenger): its directory and version, under policy
  // shadow | canary with this fraction of the requests. Empty dir: none.
  std::string challenger_model_dir;
  std::string challenger_version;
  std::string challenger_policy = "shadow";
  double challenger_fraction = 0.1;
  std::string log_level = "info";
  bool access_log = true;
  // Flags (by name, e.g. "max-batch-size") the operator set with a flag or an
  // environment variable: a model's model_config.json does not override them.
  std::set<std::string> explicit_flags;
};

// The model config file inside a model directory, beside signature.json.
inline constexpr const char* kModelConfigFile = "model_config.json";

// The settings a model_config.json may hold (its keys: flag names with '_').
std::vector<std::string> PerModelSettings();

// `config` with the per-model settings of <config.model_dir>/model_config.json
// applied where the operator set none. No file: `config` unchanged. Unknown
// keys, wrong types or out-of-range values: InvalidArgument naming the file,
// the field and the rule.
StatusOr<ServerConfig> ApplyModelConfig(const ServerConfig& config);

// The per-model settings of `config` in model_config.json's form (what
// GET /v2/models/<name>/config answers: the settings a version runs with).
nlohmann::json PerModelJson(const ServerConfig& config);

using EnvLookup = std::function<const char*(const char*)>;

// Parses argv[1..] and the environment. Returns InvalidArgument with a
// readable message for unknown flags or bad values. *help is set when
// --help/-h was given (nothing else is validated then).
StatusOr<ServerConfig> ParseConfig(const std::vector<std::string>& args,
                                   const EnvLookup& env, bool* help);

// The flag table as help text.
std::string Usage();

// "SERVING_MAX_BATCH_SIZE" for "max-batch-size".
std::string EnvNameForFlag(const std::string& flag);

}  // namespace serving

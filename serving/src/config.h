// Server configuration from command-line flags and environment variables.
// Every flag --foo-bar is also read from SERVING_FOO_BAR; flags win. KServe's
// PORT, MODEL_DIR and MODEL_NAME are honoured after the SERVING_* names.
#pragma once

#include <cstdint>
#include <functional>
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
  std::string precision = "f32";  // f32 | bf16 | auto
  bool cpu_pinning = false;       // OpenVINO CPU: pin inference threads
  bool paddle_tensorrt = false;
  int gpu_memory_mb = 512;
  // Execution.
  int workers = 1;
  int threads_per_worker = 0;  // 0: runtime default
  int64_t max_batch_size = 32;
  int64_t max_queue_delay_us = 0;
  bool dynamic_batching = true;
  int64_t max_queue_size = 4096;  // 0: unbounded
  int64_t request_timeout_ms = 10000;
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
  int keep_alive_max_count = 1000;
  int keep_alive_timeout_s = 30;
  int64_t drain_delay_ms = 0;
  std::string log_level = "info";
  bool access_log = true;
};

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

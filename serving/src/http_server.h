// KServe v2 / Open Inference Protocol REST endpoints on cpp-httplib.
//   GET  /v2/health/live | /v2/health/ready | /v2 | /metrics
//   GET  /v2/models/{name}[/versions/{v}]          model metadata
//   GET  /v2/models/{name}[/versions/{v}]/ready
//   POST /v2/models/{name}[/versions/{v}]/infer    JSON + binary tensor data
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "status.h"

namespace httplib {
class Server;
}

namespace serving {

class Model;
class Registry;
class ServingMetrics;

constexpr char kServerName[] = "paddle-mlops-server";
constexpr char kServerVersion[] = "0.1.0";

struct HttpOptions {
  std::string host = "0.0.0.0";
  int port = 8080;  // 0: any free port (see port())
  int threads = 64;
  int64_t max_body_bytes = 64ll << 20;
  int64_t request_timeout_ms = 10000;
  int keep_alive_max_count = 100;
  int keep_alive_timeout_s = 2;
  bool access_log = true;
};

class HttpServer {
 public:
  // `model`, `registry` and `metrics` must outlive the server.
  static StatusOr<std::unique_ptr<HttpServer>> Create(
      const HttpOptions& options, Model* model, Registry* registry,
      ServingMetrics* metrics);
  ~HttpServer();

  // Binds the listening socket (errors: address in use, bad host).
  Status Bind();
  // Serves until Stop(); returns after every accepted connection finished.
  void Run();
  // Closes the listener; Run() returns once in-flight requests are answered.
  void Stop();
  // Readiness reports 503 from now on (requests are still served).
  void SetDraining() { draining_ = true; }
  bool draining() const { return draining_; }
  int port() const { return port_; }

 private:
  HttpServer(const HttpOptions& options, Model* model, Registry* registry,
             ServingMetrics* metrics);
  void RegisterRoutes();

  const HttpOptions options_;
  Model* const model_;
  Registry* const registry_;
  ServingMetrics* const metrics_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> run_active_{false};
  int port_ = 0;
};

}  // namespace serving

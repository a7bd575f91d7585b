// KServe v2 / Open Inference Protocol REST endpoints on Boost.Beast (Asio):
// an event-driven HTTP/1.1 server. A connection costs a socket, a buffer
// and a few timers, never a thread: a few event-loop threads serve every
// connection, inference runs on the batcher workers, and the response is
// written back on the connection's event loop (one per I/O thread).
//   GET  /v2/health/live | /v2/health/ready | /v2 | /metrics
//   GET  /v2/models/{name}[/versions/{v}]          model metadata
//   GET  /v2/models/{name}[/versions/{v}]/ready
//   POST /v2/models/{name}[/versions/{v}]/infer    JSON + binary tensor data
//   GET  /v2/models[/{name}[/versions/{v}]]/stats  Triton statistics
//   POST /v2/repository/index                      Triton model repository
//   POST /v2/repository/models/{name}/load | unload
// Slow clients: a request's headers must arrive within --header-timeout-ms
// (--keep-alive-timeout-s between requests), its body within
// --body-timeout-ms; past --max-connections new connections get a 503.
// A body over --max-body-bytes gets a 413 with Connection: close; then the
// server stops writing and drains what the client still sends (at most
// --lingering-close-bytes, --lingering-close-ms), as nginx's lingering close
// does, so the client's upload ends and it reads the 413 instead of a reset.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "defaults.h"
#include "status.h"

namespace serving {

class ModelRepository;
class Registry;

constexpr char kServerName[] = "paddle-mlops-server";
constexpr char kServerVersion[] = "0.2.0";

struct HttpOptions {
  std::string host = "0.0.0.0";
  int port = 8080;  // 0: any free port (see port())
  int threads = 2;  // event-loop threads
  int max_connections = 8192;
  int64_t header_timeout_ms = 10000;
  int64_t body_timeout_ms = 60000;
  int64_t max_body_bytes = 64ll << 20;
  // A refused (413) body is drained, up to these bounds, after the answer.
  int64_t lingering_close_bytes = 128ll << 20;
  int64_t lingering_close_ms = 30000;
  int64_t request_timeout_ms = kDefaultRequestTimeoutMs;
  int keep_alive_max_count = 1000;
  int keep_alive_timeout_s = 30;
  bool access_log = true;
};

class HttpServer {
 public:
  // `repository` and `registry` must outlive the server.
  static StatusOr<std::unique_ptr<HttpServer>> Create(
      const HttpOptions& options, ModelRepository* repository,
      Registry* registry);
  ~HttpServer();

  // Binds the listening socket (errors: address in use, bad host).
  Status Bind();
  // Serves until Stop(); returns after every connection closed.
  void Run();
  // Closes the listener and idle connections; Run() returns once in-flight
  // requests are answered.
  void Stop();
  // Readiness reports 503 from now on (requests are still served) and every
  // response asks the client to close the connection.
  void SetDraining() { draining_ = true; }
  bool draining() const { return draining_; }
  int port() const { return port_; }
  // Open connections right now.
  int connections() const;

  struct Impl;

 private:
  HttpServer();
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
  int port_ = 0;
};

}  // namespace serving

// KServe v2 GRPCInferenceService (package inference, as tritonclient.grpc
// calls it) on gRPC's callback API: ServerLive, ServerReady, ModelReady,
// ServerMetadata, ModelMetadata and ModelInfer (raw_input_contents and
// typed contents), plus ModelStatistics and the repository RPCs. Inference
// runs on the batcher workers; no gRPC thread blocks on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "defaults.h"
#include "status.h"

namespace serving {

class ModelRepository;

struct GrpcOptions {
  std::string host = "0.0.0.0";
  int port = 8081;  // 0: any free port (see port())
  int64_t max_message_bytes = 64ll << 20;  // receive limit (= --max-body-bytes)
  int64_t request_timeout_ms = kDefaultRequestTimeoutMs;
};

class GrpcServer {
 public:
  // `repository` must outlive the server.
  static StatusOr<std::unique_ptr<GrpcServer>> Create(
      const GrpcOptions& options, ModelRepository* repository);
  ~GrpcServer();

  // Binds and starts serving (errors: address in use, bad host).
  Status Start();
  // Readiness RPCs report not ready from now on (requests are still served).
  void SetDraining();
  // Stops accepting calls; waits up to `grace_ms` for in-flight ones.
  void Shutdown(int64_t grace_ms);
  int port() const;

 private:
  GrpcServer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serving

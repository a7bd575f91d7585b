// The inference runtime behind the server: one compiled model with
// InstanceCount() independent execution contexts (one per worker).
#pragma once

#include "defaults.h"
#include <memory>
#include <string>
#include <vector>

#include "status.h"
#include "tensor.h"

namespace serving {

struct BackendOptions {
  std::string kind = "openvino";  // openvino | paddle
  std::string model_path;         // program: .pdmodel, .json (PIR) or .xml
  std::string params_path;        // weights (paddle backend; optional)
  std::string device = "CPU";     // OpenVINO device, or cpu / gpu[:id]
  std::string precision = kDefaultPrecision;  // kPrecisionValues
  bool cpu_pinning = kDefaultCpuPinning;  // OpenVINO CPU: ENABLE_CPU_PINNING
  int instances = kDefaultWorkers;  // workers, one execution context each
  int threads_per_instance = kDefaultThreadsPerWorker;  // 0: runtime decides
  int64_t max_batch_size = kDefaultMaxBatchSize;
  // Served tensors (names from signature.json), mapped to the runtime's
  // ports by runtime name when known, else by position.
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<std::string> runtime_input_names;
  std::vector<std::string> runtime_output_names;
  // Paddle Inference only.
  bool tensorrt = false;
  int gpu_memory_mb = 512;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Builds the backend named by options.kind (compiled-in backends only).
  static StatusOr<std::unique_ptr<Backend>> Create(
      const BackendOptions& options);

  virtual const std::vector<TensorSpec>& InputSpecs() const = 0;
  virtual const std::vector<TensorSpec>& OutputSpecs() const = 0;
  virtual size_t InstanceCount() const = 0;

  // Runs one batch on execution context `instance`. Inputs are in InputSpecs()
  // order with dim 0 = batch; outputs come back in OutputSpecs() order with
  // the same dim 0. Calls on different instances may run concurrently; calls
  // on one instance never do.
  virtual Status Infer(size_t instance, const std::vector<Tensor>& inputs,
                       std::vector<Tensor>* outputs) = 0;
};

}  // namespace serving

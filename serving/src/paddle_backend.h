// Paddle Inference C++ backend (CPU, GPU, optional TensorRT). Built only with
// -DWITH_PADDLE_INFERENCE=ON -DPADDLE_INFERENCE_DIR=<C++ SDK>: its headers and
// libpaddle_inference ship in the Paddle Inference SDK tarball, not in the
// paddlepaddle wheel. One predictor, cloned once per worker.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "paddle_inference_api.h"

namespace serving {

class PaddleBackend : public Backend {
 public:
  static StatusOr<std::unique_ptr<Backend>> Create(
      const BackendOptions& options);

  const std::vector<TensorSpec>& InputSpecs() const override {
    return options_.inputs;
  }
  const std::vector<TensorSpec>& OutputSpecs() const override {
    return options_.outputs;
  }
  size_t InstanceCount() const override { return predictors_.size(); }
  Status Infer(size_t instance, const std::vector<Tensor>& inputs,
               std::vector<Tensor>* outputs) override;

 private:
  explicit PaddleBackend(const BackendOptions& options) : options_(options) {}
  Status Init();

  BackendOptions options_;
  std::shared_ptr<paddle_infer::Predictor> main_;
  std::vector<std::shared_ptr<paddle_infer::Predictor>> predictors_;
  // Served tensor i <-> runtime tensor name.
  std::vector<std::string> input_names_;
  std::vector<std::string> output_names_;
};

}  // namespace serving

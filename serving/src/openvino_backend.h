// OpenVINO runtime backend: reads a Paddle program (.pdmodel via the Paddle
// frontend) or OpenVINO IR (.xml), makes the batch dim dynamic, compiles it
// once and keeps one ov::InferRequest per worker.
#pragma once

#include <memory>
#include <openvino/openvino.hpp>
#include <string>
#include <vector>

#include "backend.h"

namespace serving {

class OpenVinoBackend : public Backend {
 public:
  static StatusOr<std::unique_ptr<Backend>> Create(
      const BackendOptions& options);

  const std::vector<TensorSpec>& InputSpecs() const override {
    return options_.inputs;
  }
  const std::vector<TensorSpec>& OutputSpecs() const override {
    return options_.outputs;
  }
  size_t InstanceCount() const override { return requests_.size(); }
  Status Infer(size_t instance, const std::vector<Tensor>& inputs,
               std::vector<Tensor>* outputs) override;

 private:
  explicit OpenVinoBackend(const BackendOptions& options) : options_(options) {}
  Status Init();

  BackendOptions options_;
  ov::Core core_;
  ov::CompiledModel compiled_;
  std::vector<ov::InferRequest> requests_;
  // Served tensor i <-> runtime port input_ports_[i] / output_ports_[i].
  std::vector<size_t> input_ports_;
  std::vector<size_t> output_ports_;
};

}  // namespace serving

// signature.json of an exported model directory (written by
// components/export.py): served tensor names/shapes/dtypes, the files of
// each format, class labels and the task.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "status.h"
#include "tensor.h"

namespace serving {

struct ModelFormat {
  std::string program;  // relative to the model directory
  std::string params;
  // Runtime tensor names in signature order, when the exporter recorded them.
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
};

struct ModelSignature {
  std::string task;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::map<std::string, ModelFormat> formats;
  std::vector<std::string> label_names;

  static StatusOr<ModelSignature> Parse(const std::string& text);
  static StatusOr<ModelSignature> Load(const std::string& path);
};

}  // namespace serving

// KServe v2 / Open Inference Protocol REST codec: JSON inference requests
// (flat or nested "data"), the binary tensor data extension
// (Inference-Header-Content-Length + raw little-endian tensors after the JSON)
// and the classification extension, in both directions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "status.h"
#include "tensor.h"

namespace serving {

// An output the client asked for (all outputs when it asked for none).
struct RequestedOutput {
  std::string name;
  size_t index = 0;            // position in the model's output specs
  bool binary = false;         // return as binary tensor data
  int64_t classification = 0;  // > 0: return top-k "value:index[:label]"
};

// A validated request; inputs are in the model's input order and all share
// the batch size (dim 0).
struct InferRequest {
  std::optional<std::string> id;
  std::vector<Tensor> inputs;
  int64_t batch_size = 0;
  std::vector<RequestedOutput> outputs;
  int64_t timeout_us = 0;  // request "parameters.timeout"; 0 = none
  bool text = false;       // `inputs` are the model's text_inputs (BYTES)
};

// What the model's inputs/outputs look like and how big a request may be.
struct ModelIO {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  int64_t max_batch_size = 1;
  std::vector<std::string> labels;  // class names for "classification"
  // A text model's alternative inputs (BYTES "text", shape [-1]): raw UTF-8
  // the model tokenizes into `inputs` itself. Empty for other models.
  std::vector<TensorSpec> text_inputs;
};

// Parses the Inference-Header-Content-Length header value: the JSON part's
// length, which must not exceed the body.
StatusOr<size_t> ParseInferenceHeaderLength(const std::string& value,
                                            size_t body_size);

// Parses and validates an inference request body. `json_length` is the
// Inference-Header-Content-Length header (nullopt: the whole body is JSON).
StatusOr<InferRequest> ParseInferRequest(std::string_view body,
                                         std::optional<size_t> json_length,
                                         const ModelIO& io);

struct EncodedResponse {
  std::string body;
  // Set when binary outputs follow the JSON: send it as
  // Inference-Header-Content-Length.
  std::optional<size_t> json_length;
  std::string content_type;  // application/json | application/octet-stream
};

// Encodes the response for `request`; `outputs` are in model output order.
StatusOr<EncodedResponse> EncodeInferResponse(
    const std::string& model_name, const std::string& model_version,
    const InferRequest& request, const std::vector<Tensor>& outputs,
    const ModelIO& io);

// {"error": message}
std::string ErrorBody(const std::string& message);

// Shortest round-trip text of a float (JSON number; "null" if not finite).
std::string FormatFloat(float value);

}  // namespace serving

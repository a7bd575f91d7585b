// KServe v2 / Open Inference Protocol REST codec: JSON inference requests
// (flat or nested "data"), the binary tensor data extension
// (Inference-Header-Content-Length + raw little-endian tensors after the JSON)
// and the classification extension, in both directions.
#pragma once

#include "defaults.h"
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
  int64_t max_batch_size = kDefaultMaxBatchSize;
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

// --- checks shared by the REST (JSON) and gRPC (protobuf) codecs ----------
// Each wire format only extracts names, datatypes, shapes and data; every
// check against the model is done here, so both protocols accept the same
// requests and reject the others with the same messages.

// Whether input `name` is a text model's text input (io.text_inputs[0]): a
// request naming it sends raw text instead of the model's tensor inputs.
bool IsTextInput(const std::string& name, const ModelIO& io);
// The model as a request sees it: `io`, or with `text` a copy in `storage`
// whose inputs are io.text_inputs.
const ModelIO& RequestModelIO(const ModelIO& io, bool text, ModelIO* storage);

// Collects a request's inputs in the model's input order.
class RequestInputs {
 public:
  // `io` (see RequestModelIO) must outlive this object.
  explicit RequestInputs(const ModelIO& io);

  // The model input `name` (its index in io.inputs); InvalidArgument when
  // the model has no such input or the request gives it twice.
  StatusOr<size_t> Add(const std::string& name);
  // The input's datatype (a KServe v2 name), which must be the model's.
  Status SetDatatype(size_t index, const std::string& datatype);
  // The input's shape: non-negative dims that fit the model's (same rank,
  // fixed dims equal, a dynamic batch dim in [1, max_batch_size]).
  Status SetShape(size_t index, Shape shape);
  // Rejects the tensor parameters of unsupported extensions (shared memory).
  Status CheckParameter(size_t index, const std::string& key) const;
  // The input (name, dtype and shape set by the calls above) to fill.
  Tensor& input(size_t index) { return inputs_[index]; }

  // Checks `byte_size` bytes of raw little-endian data against the shape
  // and datatype; `what` names the size in the error ("binary_data_size").
  // BYTES (variable size) passes: Finish checks its framing.
  Status CheckRawByteSize(size_t index, int64_t byte_size,
                          const std::string& what) const;
  // Checks that `found` elements (more than the shape needs: any larger
  // number) fill the shape; `what` names the element list ("'data'").
  Status CheckElementCount(size_t index, int64_t found,
                           const std::string& what) const;
  // Every model input was given.
  Status CheckComplete() const;
  // Checks every BYTES input's length-prefixed items against its shape and
  // that all inputs share the batch size, then moves them into `request`
  // (inputs, batch_size).
  Status Finish(InferRequest* request);

 private:
  std::string Where(size_t index) const;

  const ModelIO& io_;
  std::vector<Tensor> inputs_;
  std::vector<bool> seen_;
};

// Every model output, for a request that names none.
std::vector<RequestedOutput> AllOutputs(const ModelIO& io, bool binary);
// The requested output `name`: a model output not among `requested` yet.
StatusOr<RequestedOutput> ResolveOutput(
    const std::string& name, const ModelIO& io,
    const std::vector<RequestedOutput>& requested);
// Applies an output parameter other than the format's own (binary_data):
// "classification" (top-k, >= 1; `int_value` is its integer value, nullopt
// when it is not an integer); shared memory parameters are rejected, others
// ignored.
Status ApplyOutputParameter(const std::string& key,
                            std::optional<int64_t> int_value,
                            RequestedOutput* output);
// Checks the request "timeout" parameter (microseconds, >= 0; nullopt when
// it is not an integer).
StatusOr<int64_t> CheckTimeoutParameter(std::optional<int64_t> timeout_us);

// The tensor answered for `requested`: the model's output, or for a
// classification a BYTES tensor [batch, k] of "value:index[:label]" strings
// built in `storage`. `outputs` are in model output order.
StatusOr<const Tensor*> ResponseTensor(const RequestedOutput& requested,
                                       const std::vector<Tensor>& outputs,
                                       const ModelIO& io, Tensor* storage);

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

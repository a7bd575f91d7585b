#include "codec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <type_traits>

namespace serving {
namespace {

using json = nlohmann::json;

constexpr int kMaxNestingDepth = 32;
constexpr auto kReplaceInvalidUtf8 = json::error_handler_t::replace;

std::string Quote(const std::string& text) {
  return json(text).dump(-1, ' ', false, kReplaceInvalidUtf8);
}

template <typename T>
void AppendRaw(T value, std::vector<char>* out) {
  const size_t offset = out->size();
  out->resize(offset + sizeof(T));
  std::memcpy(out->data() + offset, &value, sizeof(T));
}

template <typename T>
bool AppendInteger(const json& value, std::vector<char>* out) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
    AppendRaw(static_cast<T>(v), out);
    return true;
  }
  if (value.is_number_integer()) {
    const auto v = value.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) return false;
      if (static_cast<uint64_t>(v) > std::numeric_limits<T>::max()) {
        return false;
      }
    } else {
      if (v < std::numeric_limits<T>::min() ||
          v > std::numeric_limits<T>::max()) {
        return false;
      }
    }
    AppendRaw(static_cast<T>(v), out);
    return true;
  }
  return false;
}

// Appends one JSON scalar as `dtype`; false if it has the wrong JSON type or
// does not fit.
bool AppendElement(const json& value, DataType dtype, std::vector<char>* out) {
  switch (dtype) {
    case DataType::kBool:
      if (!value.is_boolean()) return false;
      AppendRaw<uint8_t>(value.get<bool>() ? 1 : 0, out);
      return true;
    case DataType::kFp32:
      if (!value.is_number()) return false;
      AppendRaw(value.get<float>(), out);
      return true;
    case DataType::kFp64:
      if (!value.is_number()) return false;
      AppendRaw(value.get<double>(), out);
      return true;
    case DataType::kInt8:
      return AppendInteger<int8_t>(value, out);
    case DataType::kInt16:
      return AppendInteger<int16_t>(value, out);
    case DataType::kInt32:
      return AppendInteger<int32_t>(value, out);
    case DataType::kInt64:
      return AppendInteger<int64_t>(value, out);
    case DataType::kUint8:
      return AppendInteger<uint8_t>(value, out);
    case DataType::kUint16:
      return AppendInteger<uint16_t>(value, out);
    case DataType::kUint32:
      return AppendInteger<uint32_t>(value, out);
    case DataType::kUint64:
      return AppendInteger<uint64_t>(value, out);
    case DataType::kBytes: {  // Triton's layout: 4-byte little-endian length, bytes
      if (!value.is_string()) return false;
      const auto& text = value.get_ref<const std::string&>();
      AppendRaw(static_cast<uint32_t>(text.size()), out);
      out->insert(out->end(), text.begin(), text.end());
      return true;
    }
    default:
      return false;
  }
}

// Flattens a (possibly nested) JSON array of scalars in row-major order.
Status FlattenData(const json& value, DataType dtype, const std::string& input,
                   int depth, int64_t limit, std::vector<char>* out,
                   int64_t* count) {
  if (depth > kMaxNestingDepth) {
    return InvalidArgument("input '" + input +
                           "': 'data' is nested deeper than " +
                           std::to_string(kMaxNestingDepth) + " levels");
  }
  if (value.is_array()) {
    for (const auto& element : value) {
      RETURN_IF_ERROR(
          FlattenData(element, dtype, input, depth + 1, limit, out, count));
    }
    return Status::Ok();
  }
  if (*count >= limit) {
    // Report the mismatch without converting an arbitrarily long list.
    *count = limit + 1;
    return Status::Ok();
  }
  if (!AppendElement(value, dtype, out)) {
    return InvalidArgument(
        "input '" + input + "': element " + std::to_string(*count) + " (" +
        value.dump(-1, ' ', false, kReplaceInvalidUtf8) + ") is not a valid " +
        DataTypeName(dtype) + " value");
  }
  ++*count;
  return Status::Ok();
}

// Counts the scalars of a nested JSON array (stops counting past `limit`).
int64_t CountElements(const json& value, int64_t limit, int depth = 0) {
  if (!value.is_array()) return 1;
  if (depth > kMaxNestingDepth) return limit + 1;
  int64_t total = 0;
  for (const auto& element : value) {
    total += CountElements(element, limit, depth + 1);
    if (total > limit) return total;
  }
  return total;
}

StatusOr<int64_t> GetInt(const json& object, const char* key,
                         const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) {
    return InvalidArgument(where + ": '" + key + "' must be an integer");
  }
  return it->get<int64_t>();
}

const json* FindParameters(const json& object, const std::string& where,
                           Status* status) {
  const auto it = object.find("parameters");
  if (it == object.end() || it->is_null()) return nullptr;
  if (!it->is_object()) {
    *status = InvalidArgument(where + ": 'parameters' must be an object");
    return nullptr;
  }
  return &*it;
}

bool IsSharedMemoryKey(const std::string& key) {
  return key == "shared_memory_region" || key == "shared_memory_byte_size";
}

Status SharedMemoryError(const std::string& where) {
  return InvalidArgument(where +
                         ": the shared memory extension is not supported");
}

// Calls `item(offset, size)` for each length-prefixed BYTES element of
// `tensor` (4-byte little-endian length, then the bytes); InvalidArgument
// when the framing is broken or the count does not match the shape.
template <typename Fn>
Status ForEachBytesItem(const Tensor& tensor, Fn item) {
  const int64_t count = ElementCount(tensor.shape);
  size_t offset = 0;
  int64_t items = 0;
  while (offset < tensor.data.size()) {
    if (tensor.data.size() - offset < 4) {
      return InvalidArgument("input '" + tensor.name +
                             "': BYTES data ends inside an item's 4-byte length");
    }
    uint32_t len = 0;
    std::memcpy(&len, tensor.data.data() + offset, 4);
    offset += 4;
    if (tensor.data.size() - offset < len) {
      return InvalidArgument("input '" + tensor.name + "': BYTES item " +
                             std::to_string(items) + " claims " +
                             std::to_string(len) + " bytes, " +
                             std::to_string(tensor.data.size() - offset) +
                             " remain");
    }
    item(offset, static_cast<size_t>(len));
    offset += len;
    ++items;
  }
  if (items != count) {
    return InvalidArgument("input '" + tensor.name + "': " +
                           std::to_string(items) + " BYTES items but shape " +
                           ShapeToString(tensor.shape) + " needs " +
                           std::to_string(count));
  }
  return Status::Ok();
}

// The batch size (dim 0) that all inputs must share; 1 without inputs.
StatusOr<int64_t> CommonBatchSize(const std::vector<Tensor>& inputs) {
  int64_t batch_size = 1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& tensor = inputs[i];
    const int64_t batch = tensor.shape.empty() ? 1 : tensor.shape[0];
    if (i == 0) {
      batch_size = batch;
    } else if (batch != batch_size) {
      return InvalidArgument("inputs disagree on the batch size (dim 0): '" +
                             inputs[0].name + "' has " +
                             std::to_string(batch_size) + ", '" + tensor.name +
                             "' has " + std::to_string(batch));
    }
  }
  return batch_size;
}

// The integer value of a JSON parameter (nullopt: not an integer).
std::optional<int64_t> JsonInt(const json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  return value.get<int64_t>();
}

struct PendingBinary {
  size_t input_index;  // index into the model's inputs
  size_t byte_size;
};

// The requested outputs: "outputs", or all of them when it is absent/empty.
Status ParseOutputs(const json& root, const ModelIO& io, bool binary_default,
                    std::vector<RequestedOutput>* outputs) {
  const auto it = root.find("outputs");
  if (it == root.end() || it->is_null() || (it->is_array() && it->empty())) {
    *outputs = AllOutputs(io, binary_default);
    return Status::Ok();
  }
  if (!it->is_array()) return InvalidArgument("'outputs' must be an array");
  for (const auto& out : *it) {
    if (!out.is_object()) {
      return InvalidArgument("each element of 'outputs' must be an object");
    }
    const auto name_it = out.find("name");
    if (name_it == out.end() || !name_it->is_string()) {
      return InvalidArgument("each requested output needs a string 'name'");
    }
    ASSIGN_OR_RETURN(RequestedOutput requested,
                     ResolveOutput(name_it->get<std::string>(), io, *outputs));
    requested.binary = binary_default;
    const std::string where = "output '" + requested.name + "'";
    Status status;
    const json* params = FindParameters(out, where, &status);
    RETURN_IF_ERROR(status);
    if (params != nullptr) {
      for (const auto& [key, value] : params->items()) {
        if (key != "binary_data") {
          RETURN_IF_ERROR(
              ApplyOutputParameter(key, JsonInt(value), &requested));
        } else if (!value.is_boolean()) {
          return InvalidArgument(where + ": 'binary_data' must be a boolean");
        } else {
          requested.binary = value.get<bool>();
        }
      }
    }
    outputs->push_back(std::move(requested));
  }
  return Status::Ok();
}

// Checks the JSON header (the first `header_size` bytes of `body`) and parses
// it into `root`, which must be an object.
Status ParseJsonHeader(std::string_view body, size_t header_size,
                       bool has_length_header, json* root) {
  if (header_size > body.size()) {
    return InvalidArgument(
        "Inference-Header-Content-Length " + std::to_string(header_size) +
        " exceeds the request body size " + std::to_string(body.size()));
  }
  if (header_size == 0) return InvalidArgument("empty inference request");

  // nlohmann stops at a NUL byte; binary bytes in the JSON part mean the
  // client sent tensor data without announcing where the JSON ends.
  if (std::memchr(body.data(), '\0', header_size) != nullptr) {
    return InvalidArgument(
        has_length_header
            ? "malformed JSON in request: NUL byte in the JSON header"
            : "request body is not JSON: binary tensor data needs the "
              "Inference-Header-Content-Length header");
  }
  try {
    *root = json::parse(body.begin(), body.begin() + header_size);
  } catch (const json::parse_error& e) {
    return InvalidArgument(std::string("malformed JSON in request: ") +
                           e.what());
  }
  if (!root->is_object()) {
    return InvalidArgument("the inference request must be a JSON object");
  }
  return Status::Ok();
}

// The optional request "id" (absent or null: none).
Status ParseRequestId(const json& root, std::optional<std::string>* id) {
  if (const auto it = root.find("id"); it != root.end() && !it->is_null()) {
    if (!it->is_string()) return InvalidArgument("'id' must be a string");
    *id = it->get<std::string>();
  }
  return Status::Ok();
}

// The request-level "parameters": "binary_data_output" (the default of the
// outputs' "binary_data") and "timeout" (microseconds).
Status ParseRequestParameters(const json& root, bool* binary_output_default,
                              int64_t* timeout_us) {
  Status status;
  const json* params = FindParameters(root, "request", &status);
  RETURN_IF_ERROR(status);
  if (params == nullptr) return Status::Ok();
  if (const auto b = params->find("binary_data_output"); b != params->end()) {
    if (!b->is_boolean()) {
      return InvalidArgument("'binary_data_output' must be a boolean");
    }
    *binary_output_default = b->get<bool>();
  }
  if (const auto t = params->find("timeout"); t != params->end()) {
    ASSIGN_OR_RETURN(*timeout_us, CheckTimeoutParameter(JsonInt(*t)));
  }
  return Status::Ok();
}

// The model input that the request element `in` names (see
// RequestInputs::Add).
StatusOr<size_t> AddInput(const json& in, RequestInputs* inputs) {
  if (!in.is_object()) {
    return InvalidArgument("each element of 'inputs' must be an object");
  }
  const auto name_it = in.find("name");
  if (name_it == in.end() || !name_it->is_string()) {
    return InvalidArgument("each input needs a string 'name'");
  }
  return inputs->Add(name_it->get<std::string>());
}

// The input's "datatype" (see RequestInputs::SetDatatype).
Status ParseInputDatatype(const json& in, const std::string& where,
                          size_t index, RequestInputs* inputs) {
  const auto dt_it = in.find("datatype");
  if (dt_it == in.end() || !dt_it->is_string()) {
    return InvalidArgument(where + " needs a string 'datatype'");
  }
  return inputs->SetDatatype(index, dt_it->get<std::string>());
}

// The input's "shape" (see RequestInputs::SetShape).
Status ParseInputShape(const json& in, const std::string& where, size_t index,
                       RequestInputs* inputs) {
  const auto shape_it = in.find("shape");
  if (shape_it == in.end() || !shape_it->is_array()) {
    return InvalidArgument(where + " needs a 'shape' array");
  }
  Shape shape;
  for (const auto& dim : *shape_it) {
    if (!dim.is_number_integer()) {
      return InvalidArgument(where +
                             ": 'shape' must hold non-negative integers");
    }
    shape.push_back(dim.get<int64_t>());
  }
  return inputs->SetShape(index, std::move(shape));
}

// Converts the input's JSON "data" (flat or nested) into the input at
// `index`, whose name, dtype and shape are set.
Status ConvertJsonData(const json& data, size_t index, RequestInputs* inputs) {
  Tensor& tensor = inputs->input(index);
  const int64_t count = ElementCount(tensor.shape);
  RETURN_IF_ERROR(
      inputs->CheckElementCount(index, CountElements(data, count), "'data'"));
  tensor.data.reserve(static_cast<size_t>(count) *
                      std::max<size_t>(4, DataTypeByteSize(tensor.dtype)));
  int64_t converted = 0;
  return FlattenData(data, tensor.dtype, tensor.name, 0, count, &tensor.data,
                     &converted);
}

// Fills the input at `index` (name, dtype and shape set) from its JSON
// "data", or queues it in `binaries` when its data follows the JSON.
Status ParseInputData(const json& in, const json* params,
                      const std::string& where, size_t index,
                      RequestInputs* inputs,
                      std::vector<PendingBinary>* binaries) {
  const bool has_binary =
      params != nullptr && params->contains("binary_data_size");
  const auto data_it = in.find("data");
  const bool has_data = data_it != in.end();
  if (has_binary && has_data) {
    return InvalidArgument(where + " has both 'data' and 'binary_data_size'");
  }
  if (has_binary) {
    ASSIGN_OR_RETURN(const int64_t size,
                     GetInt(*params, "binary_data_size", where));
    if (size < 0 && inputs->input(index).dtype == DataType::kBytes) {
      return InvalidArgument(where + ": binary_data_size must be >= 0");
    }
    RETURN_IF_ERROR(inputs->CheckRawByteSize(index, size, "binary_data_size"));
    binaries->push_back({index, static_cast<size_t>(size)});
    return Status::Ok();
  }
  if (has_data) return ConvertJsonData(*data_it, index, inputs);
  return InvalidArgument(where + " has neither 'data' nor 'binary_data_size'");
}

// Parses one element of "inputs" into its slot of `inputs`.
Status ParseInput(const json& in, RequestInputs* inputs,
                  std::vector<PendingBinary>* binaries) {
  ASSIGN_OR_RETURN(const size_t index, AddInput(in, inputs));
  const std::string where = "input '" + inputs->input(index).name + "'";
  RETURN_IF_ERROR(ParseInputDatatype(in, where, index, inputs));
  RETURN_IF_ERROR(ParseInputShape(in, where, index, inputs));

  Status status;
  const json* params = FindParameters(in, where, &status);
  RETURN_IF_ERROR(status);
  if (params != nullptr) {
    for (const auto& [key, value] : params->items()) {
      RETURN_IF_ERROR(inputs->CheckParameter(index, key));
    }
  }
  return ParseInputData(in, params, where, index, inputs, binaries);
}

// Parses "inputs" into `inputs`: each model input exactly once. Inputs sent
// as binary data are queued in `binaries`, in request order.
Status ParseInputs(const json& root, RequestInputs* inputs,
                   std::vector<PendingBinary>* binaries) {
  const auto inputs_it = root.find("inputs");
  if (inputs_it == root.end() || !inputs_it->is_array()) {
    return InvalidArgument("the request needs an 'inputs' array");
  }
  for (const auto& in : *inputs_it) {
    RETURN_IF_ERROR(ParseInput(in, inputs, binaries));
  }
  return inputs->CheckComplete();
}

// Copies the binary tensor data after the JSON header into `inputs`: the
// tensors follow the JSON in the order the inputs were listed, and every byte
// of the body must belong to one.
Status ReadBinaryInputs(std::string_view body, size_t header_size,
                        bool has_length_header,
                        const std::vector<PendingBinary>& binaries,
                        RequestInputs* inputs) {
  size_t offset = header_size;
  for (const auto& pending : binaries) {
    Tensor& tensor = inputs->input(pending.input_index);
    if (body.size() - offset < pending.byte_size) {
      return InvalidArgument("request body is truncated: input '" +
                             tensor.name + "' needs " +
                             std::to_string(pending.byte_size) +
                             " bytes of binary data at offset " +
                             std::to_string(offset - header_size) +
                             " but only " +
                             std::to_string(body.size() - offset) + " remain");
    }
    tensor.data.assign(body.data() + offset,
                       body.data() + offset + pending.byte_size);
    offset += pending.byte_size;
  }
  if (offset != body.size()) {
    if (!has_length_header) {
      return InvalidArgument(
          "binary input data needs the Inference-Header-Content-Length header");
    }
    return InvalidArgument(
        "request body has " + std::to_string(body.size() - offset) +
        " bytes after the JSON header and binary inputs that no input claims");
  }
  return Status::Ok();
}

void AppendJsonElement(const char* src, DataType dtype, std::string* out) {
  char buf[32];
  auto write_int = [&](auto v) {
    auto res = std::to_chars(buf, buf + sizeof(buf), v);
    out->append(buf, res.ptr);
  };
  switch (dtype) {
    case DataType::kFp32: {
      float v;
      std::memcpy(&v, src, sizeof(v));
      out->append(FormatFloat(v));
      return;
    }
    case DataType::kFp64: {
      double v;
      std::memcpy(&v, src, sizeof(v));
      if (!std::isfinite(v)) {
        out->append("null");
        return;
      }
      auto res = std::to_chars(buf, buf + sizeof(buf), v);
      out->append(buf, res.ptr);
      return;
    }
    case DataType::kBool:
      out->append(*src ? "true" : "false");
      return;
#define SERVING_INT_CASE(DT, T)      \
  case DT: {                         \
    T v;                             \
    std::memcpy(&v, src, sizeof(v)); \
    write_int(v);                    \
    return;                          \
  }
      SERVING_INT_CASE(DataType::kInt8, int8_t)
      SERVING_INT_CASE(DataType::kInt16, int16_t)
      SERVING_INT_CASE(DataType::kInt32, int32_t)
      SERVING_INT_CASE(DataType::kInt64, int64_t)
      SERVING_INT_CASE(DataType::kUint8, uint8_t)
      SERVING_INT_CASE(DataType::kUint16, uint16_t)
      SERVING_INT_CASE(DataType::kUint32, uint32_t)
      SERVING_INT_CASE(DataType::kUint64, uint64_t)
#undef SERVING_INT_CASE
    default:
      out->append("null");
  }
}

// Top-k classification strings for each sample of `tensor` (FP32 only).
StatusOr<std::vector<std::string>> Classify(
    const Tensor& tensor, int64_t k, const std::vector<std::string>& labels,
    int64_t* out_k) {
  if (tensor.dtype != DataType::kFp32) {
    return InvalidArgument("output '" + tensor.name +
                           "': classification needs an FP32 output");
  }
  if (tensor.shape.empty()) {
    return InvalidArgument("output '" + tensor.name +
                           "': classification needs a batched output");
  }
  const int64_t batch = tensor.shape[0];
  const int64_t classes = batch > 0 ? tensor.element_count() / batch : 0;
  k = std::min(k, classes);
  *out_k = k;
  std::vector<std::string> result;
  result.reserve(static_cast<size_t>(batch * k));
  const float* values = tensor.data_as<float>();
  std::vector<int64_t> order(static_cast<size_t>(classes));
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = values + b * classes;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [row](int64_t a, int64_t c) {
                        return row[a] > row[c] || (row[a] == row[c] && a < c);
                      });
    for (int64_t i = 0; i < k; ++i) {
      const int64_t idx = order[static_cast<size_t>(i)];
      std::string entry = FormatFloat(row[idx]) + ":" + std::to_string(idx);
      if (static_cast<size_t>(idx) < labels.size()) {
        entry += ":" + labels[static_cast<size_t>(idx)];
      }
      result.push_back(std::move(entry));
    }
  }
  return result;
}

// Whether the request sends the model's text inputs (io.text_inputs) instead
// of its tensor inputs: it names the first text input.
bool SendsText(const json& root, const ModelIO& io) {
  const auto it = root.find("inputs");
  if (it == root.end() || !it->is_array()) return false;
  for (const auto& in : *it) {
    if (in.is_object() && in.contains("name") && in["name"].is_string() &&
        IsTextInput(in["name"].get<std::string>(), io)) {
      return true;
    }
  }
  return false;
}

// JSON strings of a BYTES tensor's items (invalid UTF-8 replaced).
Status AppendJsonBytes(const Tensor& tensor, std::string* out) {
  bool first = true;
  return ForEachBytesItem(tensor, [&](size_t offset, size_t size) {
    if (!first) *out += ",";
    first = false;
    *out += Quote(std::string(tensor.data.data() + offset, size));
  });
}

}  // namespace

std::string FormatFloat(float value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

std::string ErrorBody(const std::string& message) {
  return "{\"error\":" + Quote(message) + "}";
}

StatusOr<size_t> ParseInferenceHeaderLength(const std::string& value,
                                            size_t body_size) {
  size_t length = 0;
  const char* begin = value.data();
  const char* end = value.data() + value.size();
  while (begin < end && *begin == ' ')
    ++begin;
  while (end > begin && *(end - 1) == ' ')
    --end;
  auto res = std::from_chars(begin, end, length);
  if (begin == end || res.ec != std::errc() || res.ptr != end) {
    return InvalidArgument(
        "Inference-Header-Content-Length must be a non-negative integer, got "
        "'" +
        value + "'");
  }
  if (length > body_size) {
    return InvalidArgument(
        "Inference-Header-Content-Length " + std::to_string(length) +
        " exceeds the request body size " + std::to_string(body_size));
  }
  return length;
}

bool IsTextInput(const std::string& name, const ModelIO& io) {
  return !io.text_inputs.empty() && name == io.text_inputs[0].name;
}

const ModelIO& RequestModelIO(const ModelIO& io, bool text, ModelIO* storage) {
  if (!text) return io;
  *storage = io;
  storage->inputs = io.text_inputs;
  return *storage;
}

RequestInputs::RequestInputs(const ModelIO& io)
    : io_(io), inputs_(io.inputs.size()), seen_(io.inputs.size(), false) {}

std::string RequestInputs::Where(size_t index) const {
  return "input '" + io_.inputs[index].name + "'";
}

StatusOr<size_t> RequestInputs::Add(const std::string& name) {
  size_t index = io_.inputs.size();
  for (size_t i = 0; i < io_.inputs.size(); ++i) {
    if (io_.inputs[i].name == name) index = i;
  }
  if (index == io_.inputs.size()) {
    std::string known;
    for (const auto& spec : io_.inputs) {
      known += (known.empty() ? "'" : ", '") + spec.name + "'";
    }
    return InvalidArgument("unexpected input '" + name +
                           "'; the model expects " + known);
  }
  if (seen_[index]) {
    return InvalidArgument(Where(index) + " is given more than once");
  }
  seen_[index] = true;
  inputs_[index].name = io_.inputs[index].name;
  return index;
}

Status RequestInputs::SetDatatype(size_t index, const std::string& datatype) {
  const TensorSpec& spec = io_.inputs[index];
  const DataType dtype = DataTypeFromName(datatype);
  if (dtype == DataType::kInvalid) {
    return InvalidArgument(Where(index) + ": unknown datatype '" + datatype +
                           "'");
  }
  if (dtype != spec.dtype) {
    return InvalidArgument(Where(index) + ": datatype " + datatype +
                           " is not supported, the model expects " +
                           DataTypeName(spec.dtype));
  }
  inputs_[index].dtype = dtype;
  return Status::Ok();
}

Status RequestInputs::SetShape(size_t index, Shape shape) {
  const TensorSpec& spec = io_.inputs[index];
  const std::string where = Where(index);
  for (const int64_t dim : shape) {
    if (dim < 0) {
      return InvalidArgument(where +
                             ": 'shape' must hold non-negative integers");
    }
  }
  if (shape.size() != spec.shape.size()) {
    return InvalidArgument(where + ": shape " + ShapeToString(shape) +
                           " does not match the model's " +
                           ShapeToString(spec.shape) + " (rank " +
                           std::to_string(shape.size()) + " vs " +
                           std::to_string(spec.shape.size()) + ")");
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (spec.shape[d] >= 0 && shape[d] != spec.shape[d]) {
      return InvalidArgument(where + ": shape " + ShapeToString(shape) +
                             " does not match the model's " +
                             ShapeToString(spec.shape) + " at dim " +
                             std::to_string(d));
    }
  }
  if (!shape.empty() && spec.shape[0] < 0) {
    if (shape[0] < 1) {
      return InvalidArgument(where + ": batch size (dim 0) must be at least 1");
    }
    if (shape[0] > io_.max_batch_size) {
      return InvalidArgument(
          where + ": batch size " + std::to_string(shape[0]) +
          " exceeds the max batch size " + std::to_string(io_.max_batch_size));
    }
  }
  inputs_[index].shape = std::move(shape);
  return Status::Ok();
}

Status RequestInputs::CheckParameter(size_t index,
                                     const std::string& key) const {
  if (IsSharedMemoryKey(key)) return SharedMemoryError(Where(index));
  return Status::Ok();
}

Status RequestInputs::CheckRawByteSize(size_t index, int64_t byte_size,
                                       const std::string& what) const {
  const Tensor& tensor = inputs_[index];
  if (tensor.dtype == DataType::kBytes) return Status::Ok();
  const size_t expected = static_cast<size_t>(ElementCount(tensor.shape)) *
                          DataTypeByteSize(tensor.dtype);
  if (byte_size < 0 || static_cast<size_t>(byte_size) != expected) {
    return InvalidArgument(
        Where(index) + ": " + what + " " + std::to_string(byte_size) +
        " does not match shape " + ShapeToString(tensor.shape) + " of " +
        DataTypeName(tensor.dtype) + " (" + std::to_string(expected) +
        " bytes)");
  }
  return Status::Ok();
}

Status RequestInputs::CheckElementCount(size_t index, int64_t found,
                                        const std::string& what) const {
  const Tensor& tensor = inputs_[index];
  const int64_t count = ElementCount(tensor.shape);
  if (found == count) return Status::Ok();
  return InvalidArgument(Where(index) + ": " + what + " has " +
                         (found > count ? "more than " + std::to_string(count)
                                        : std::to_string(found)) +
                         " elements but shape " + ShapeToString(tensor.shape) +
                         " needs " + std::to_string(count));
}

Status RequestInputs::CheckComplete() const {
  for (size_t i = 0; i < io_.inputs.size(); ++i) {
    if (!seen_[i]) {
      return InvalidArgument("missing input '" + io_.inputs[i].name + "'");
    }
  }
  return Status::Ok();
}

Status RequestInputs::Finish(InferRequest* request) {
  for (const auto& tensor : inputs_) {
    if (tensor.dtype != DataType::kBytes) continue;
    RETURN_IF_ERROR(ForEachBytesItem(tensor, [](size_t, size_t) {}));
  }
  ASSIGN_OR_RETURN(request->batch_size, CommonBatchSize(inputs_));
  request->inputs = std::move(inputs_);
  return Status::Ok();
}

std::vector<RequestedOutput> AllOutputs(const ModelIO& io, bool binary) {
  std::vector<RequestedOutput> outputs;
  for (size_t i = 0; i < io.outputs.size(); ++i) {
    outputs.push_back({io.outputs[i].name, i, binary, 0});
  }
  return outputs;
}

StatusOr<RequestedOutput> ResolveOutput(
    const std::string& name, const ModelIO& io,
    const std::vector<RequestedOutput>& requested) {
  size_t index = io.outputs.size();
  for (size_t i = 0; i < io.outputs.size(); ++i) {
    if (io.outputs[i].name == name) index = i;
  }
  if (index == io.outputs.size()) {
    std::string known;
    for (const auto& spec : io.outputs) {
      known += (known.empty() ? "'" : ", '") + spec.name + "'";
    }
    return InvalidArgument("unknown output '" + name + "'; the model has " +
                           known);
  }
  for (const auto& seen : requested) {
    if (seen.name == name) {
      return InvalidArgument("output '" + name +
                             "' is requested more than once");
    }
  }
  return RequestedOutput{name, index, false, 0};
}

Status ApplyOutputParameter(const std::string& key,
                            std::optional<int64_t> int_value,
                            RequestedOutput* output) {
  const std::string where = "output '" + output->name + "'";
  if (IsSharedMemoryKey(key)) return SharedMemoryError(where);
  if (key != "classification") return Status::Ok();
  if (!int_value.has_value()) {
    return InvalidArgument(where + ": 'classification' must be an integer");
  }
  if (*int_value < 1) {
    return InvalidArgument(where + ": 'classification' must be >= 1");
  }
  output->classification = *int_value;
  return Status::Ok();
}

StatusOr<int64_t> CheckTimeoutParameter(std::optional<int64_t> timeout_us) {
  if (!timeout_us.has_value()) {
    return InvalidArgument("request parameters: 'timeout' must be an integer");
  }
  if (*timeout_us < 0) {
    return InvalidArgument("'timeout' must be >= 0 (microseconds)");
  }
  return *timeout_us;
}

StatusOr<const Tensor*> ResponseTensor(const RequestedOutput& requested,
                                       const std::vector<Tensor>& outputs,
                                       const ModelIO& io, Tensor* storage) {
  if (requested.index >= outputs.size()) {
    return Internal("the backend returned no tensor for output '" +
                    requested.name + "'");
  }
  const Tensor& tensor = outputs[requested.index];
  if (requested.classification <= 0) return &tensor;
  int64_t k = 0;
  ASSIGN_OR_RETURN(const auto classes,
                   Classify(tensor, requested.classification, io.labels, &k));
  storage->name = requested.name;
  storage->dtype = DataType::kBytes;
  storage->shape = {tensor.shape[0], k};
  storage->data.clear();
  for (const auto& text : classes) {
    AppendRaw(static_cast<uint32_t>(text.size()), &storage->data);
    storage->data.insert(storage->data.end(), text.begin(), text.end());
  }
  return storage;
}

StatusOr<InferRequest> ParseInferRequest(std::string_view body,
                                         std::optional<size_t> json_length,
                                         const ModelIO& model_io) {
  const size_t header_size = json_length.value_or(body.size());
  const bool has_length_header = json_length.has_value();
  json root;
  RETURN_IF_ERROR(ParseJsonHeader(body, header_size, has_length_header, &root));

  InferRequest request;
  RETURN_IF_ERROR(ParseRequestId(root, &request.id));
  bool binary_output_default = false;
  RETURN_IF_ERROR(ParseRequestParameters(root, &binary_output_default,
                                         &request.timeout_us));
  // A text model takes raw text (its text inputs) or token ids (its inputs).
  request.text = SendsText(root, model_io);
  ModelIO text_io;
  const ModelIO& io = RequestModelIO(model_io, request.text, &text_io);
  RequestInputs inputs(io);
  std::vector<PendingBinary> binaries;
  RETURN_IF_ERROR(ParseInputs(root, &inputs, &binaries));
  RETURN_IF_ERROR(ReadBinaryInputs(body, header_size, has_length_header,
                                   binaries, &inputs));
  RETURN_IF_ERROR(inputs.Finish(&request));
  RETURN_IF_ERROR(
      ParseOutputs(root, io, binary_output_default, &request.outputs));
  return request;
}

StatusOr<EncodedResponse> EncodeInferResponse(
    const std::string& model_name, const std::string& model_version,
    const InferRequest& request, const std::vector<Tensor>& outputs,
    const ModelIO& io) {
  std::string header = "{\"model_name\":" + Quote(model_name) +
                       ",\"model_version\":" + Quote(model_version);
  if (request.id.has_value()) header += ",\"id\":" + Quote(*request.id);
  header += ",\"outputs\":[";

  std::string binary;
  bool first = true;
  Tensor storage;
  for (const auto& requested : request.outputs) {
    ASSIGN_OR_RETURN(const Tensor* tensor,
                     ResponseTensor(requested, outputs, io, &storage));
    if (!first) header += ",";
    first = false;
    header += "{\"name\":" + Quote(requested.name) + ",\"datatype\":\"" +
              std::string(DataTypeName(tensor->dtype)) +
              "\",\"shape\":" + ShapeToString(tensor->shape);
    if (requested.binary) {
      header += ",\"parameters\":{\"binary_data_size\":" +
                std::to_string(tensor->data.size()) + "}}";
      binary.append(tensor->data.data(), tensor->data.size());
      continue;
    }
    header += ",\"data\":[";
    if (tensor->dtype == DataType::kBytes) {
      RETURN_IF_ERROR(AppendJsonBytes(*tensor, &header));
      header += "]}";
      continue;
    }
    const size_t element_size = DataTypeByteSize(tensor->dtype);
    if (element_size == 0 || tensor->dtype == DataType::kFp16 ||
        tensor->dtype == DataType::kBf16) {
      return InvalidArgument("output '" + requested.name + "' of datatype " +
                             DataTypeName(tensor->dtype) +
                             " can only be returned as binary data");
    }
    const size_t count = tensor->data.size() / element_size;
    header.reserve(header.size() + count * 12 + 4);
    for (size_t i = 0; i < count; ++i) {
      if (i > 0) header += ",";
      AppendJsonElement(tensor->data.data() + i * element_size, tensor->dtype,
                        &header);
    }
    header += "]}";
  }
  header += "]}";

  EncodedResponse response;
  bool any_binary = false;
  for (const auto& requested : request.outputs)
    any_binary |= requested.binary;
  if (any_binary) {
    response.json_length = header.size();
    response.content_type = "application/octet-stream";
    response.body = std::move(header);
    response.body += binary;
  } else {
    response.content_type = "application/json";
    response.body = std::move(header);
  }
  return response;
}

}  // namespace serving

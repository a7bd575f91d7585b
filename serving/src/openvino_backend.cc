#include "openvino_backend.h"

#include <cstring>
#include <exception>
#include <map>

#include "logging.h"

namespace serving {
namespace {

StatusOr<ov::element::Type> ToOvType(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return ov::element::boolean;
    case DataType::kUint8:
      return ov::element::u8;
    case DataType::kUint16:
      return ov::element::u16;
    case DataType::kUint32:
      return ov::element::u32;
    case DataType::kUint64:
      return ov::element::u64;
    case DataType::kInt8:
      return ov::element::i8;
    case DataType::kInt16:
      return ov::element::i16;
    case DataType::kInt32:
      return ov::element::i32;
    case DataType::kInt64:
      return ov::element::i64;
    case DataType::kFp16:
      return ov::element::f16;
    case DataType::kBf16:
      return ov::element::bf16;
    case DataType::kFp32:
      return ov::element::f32;
    case DataType::kFp64:
      return ov::element::f64;
    default:
      return InvalidArgument(std::string("datatype ") + DataTypeName(dtype) +
                             " is not supported by the OpenVINO backend");
  }
}

// OpenVINO messages start with "Exception from <file>:<line>:" lines; keep
// the rest on one line.
std::string FirstLine(const char* what) {
  std::string out;
  std::string text(what);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) {
      line.pop_back();
    }
    if (!line.empty() && line.rfind("Exception from ", 0) != 0) {
      out += (out.empty() ? "" : " ") + line;
    }
    start = end + 1;
  }
  return out.empty() ? std::string(what) : out;
}

// Port index for served tensor `i`: the port carrying the runtime name
// recorded in the signature (or the served name), else position i.
template <typename Ports>
StatusOr<std::vector<size_t>> MapPorts(const Ports& ports,
                                       const std::vector<TensorSpec>& specs,
                                       const std::vector<std::string>& hints,
                                       const char* what) {
  if (ports.size() != specs.size()) {
    return InvalidArgument("the model has " + std::to_string(ports.size()) +
                           " " + what + "s but signature.json declares " +
                           std::to_string(specs.size()));
  }
  std::vector<size_t> mapping;
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t chosen = i;
    for (const std::string& name :
         {i < hints.size() ? hints[i] : std::string(), specs[i].name}) {
      if (name.empty()) continue;
      bool found = false;
      for (size_t p = 0; p < ports.size(); ++p) {
        if (ports[p].get_names().count(name) > 0) {
          chosen = p;
          found = true;
          break;
        }
      }
      if (found) break;
    }
    mapping.push_back(chosen);
  }
  return mapping;
}

// Fixed dims of the signature must agree with the runtime's static dims.
Status CheckShape(const ov::PartialShape& runtime, const TensorSpec& spec) {
  if (runtime.rank().is_dynamic()) return Status::Ok();
  if (static_cast<size_t>(runtime.rank().get_length()) != spec.shape.size()) {
    return InvalidArgument("tensor '" + spec.name + "': the model has shape " +
                           runtime.to_string() + " but signature.json says " +
                           ShapeToString(spec.shape));
  }
  for (size_t d = 1; d < spec.shape.size(); ++d) {
    const auto& dim = runtime[d];
    if (spec.shape[d] >= 0 && dim.is_static() &&
        dim.get_length() != spec.shape[d]) {
      return InvalidArgument("tensor '" + spec.name +
                             "': the model has shape " + runtime.to_string() +
                             " but signature.json says " +
                             ShapeToString(spec.shape));
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> OpenVinoBackend::Create(
    const BackendOptions& options) {
  if (options.instances < 1) return InvalidArgument("need at least 1 worker");
  std::unique_ptr<OpenVinoBackend> backend(new OpenVinoBackend(options));
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

Status OpenVinoBackend::Init() {
  std::shared_ptr<ov::Model> model;
  try {
    model = core_.read_model(options_.model_path);
  } catch (const std::exception& e) {
    return InvalidArgument("OpenVINO cannot read " + options_.model_path +
                           ": " + FirstLine(e.what()));
  }

  ASSIGN_OR_RETURN(input_ports_,
                   MapPorts(model->inputs(), options_.inputs,
                            options_.runtime_input_names, "input"));
  ASSIGN_OR_RETURN(output_ports_,
                   MapPorts(model->outputs(), options_.outputs,
                            options_.runtime_output_names, "output"));

  // Dynamic batch dimension on every input so any batch <= max works.
  std::map<size_t, ov::PartialShape> shapes;
  for (size_t i = 0; i < options_.inputs.size(); ++i) {
    const auto& port = model->input(input_ports_[i]);
    ov::PartialShape shape = port.get_partial_shape();
    RETURN_IF_ERROR(CheckShape(shape, options_.inputs[i]));
    ASSIGN_OR_RETURN(const auto type, ToOvType(options_.inputs[i].dtype));
    if (port.get_element_type() != type) {
      return InvalidArgument(
          "input '" + options_.inputs[i].name + "': the model takes " +
          port.get_element_type().get_type_name() +
          " but signature.json says " + DataTypeName(options_.inputs[i].dtype));
    }
    if (shape.rank().is_static() && shape.rank().get_length() > 0) {
      shape[0] = ov::Dimension::dynamic();
    }
    shapes[input_ports_[i]] = shape;
  }
  try {
    model->reshape(shapes);
  } catch (const std::exception& e) {
    return InvalidArgument("cannot make the batch dimension dynamic: " +
                           FirstLine(e.what()));
  }
  for (size_t i = 0; i < options_.outputs.size(); ++i) {
    const auto& port = model->output(output_ports_[i]);
    RETURN_IF_ERROR(CheckShape(port.get_partial_shape(), options_.outputs[i]));
    ASSIGN_OR_RETURN(const auto type, ToOvType(options_.outputs[i].dtype));
    if (port.get_element_type() != type) {
      return InvalidArgument("output '" + options_.outputs[i].name +
                             "': the model returns " +
                             port.get_element_type().get_type_name() +
                             " but signature.json says " +
                             DataTypeName(options_.outputs[i].dtype));
    }
  }

  ov::AnyMap config;
  const bool cpu = options_.device == "CPU";
  if (cpu) {
    if (options_.precision == "f32") {
      config.emplace(ov::hint::inference_precision(ov::element::f32));
    } else if (options_.precision == "bf16") {
      config.emplace(ov::hint::inference_precision(ov::element::bf16));
    }
    config.emplace(ov::hint::enable_cpu_pinning(options_.cpu_pinning));
    // One stream per worker so their infer requests run in parallel.
    config.emplace(ov::num_streams(options_.instances));
    if (options_.threads_per_instance > 0) {
      config.emplace(ov::inference_num_threads(options_.threads_per_instance *
                                               options_.instances));
    }
  }
  try {
    compiled_ = core_.compile_model(model, options_.device, config);
    for (int i = 0; i < options_.instances; ++i) {
      requests_.push_back(compiled_.create_infer_request());
    }
  } catch (const std::exception& e) {
    return InvalidArgument("OpenVINO cannot compile " + options_.model_path +
                           " for " + options_.device + ": " +
                           FirstLine(e.what()));
  }

  nlohmann::json info = {{"model", options_.model_path},
                         {"device", options_.device},
                         {"workers", options_.instances},
                         {"openvino", ov::get_openvino_version().buildNumber}};
  try {
    if (cpu) {
      info["precision"] =
          compiled_.get_property(ov::hint::inference_precision).get_type_name();
      info["streams"] = compiled_.get_property(ov::num_streams).num;
      info["threads"] = compiled_.get_property(ov::inference_num_threads);
      info["cpu_pinning"] = compiled_.get_property(ov::hint::enable_cpu_pinning);
    }
  } catch (const std::exception&) {
    // Informational only.
  }
  LogInfo("openvino model compiled", info);
  return Status::Ok();
}

Status OpenVinoBackend::Infer(size_t instance,
                              const std::vector<Tensor>& inputs,
                              std::vector<Tensor>* outputs) {
  if (instance >= requests_.size()) {
    return Internal("no OpenVINO infer request #" + std::to_string(instance));
  }
  if (inputs.size() != input_ports_.size()) {
    return Internal("expected " + std::to_string(input_ports_.size()) +
                    " inputs, got " + std::to_string(inputs.size()));
  }
  ov::InferRequest& request = requests_[instance];
  try {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& in = inputs[i];
      ASSIGN_OR_RETURN(const auto type, ToOvType(in.dtype));
      ov::Shape shape(in.shape.begin(), in.shape.end());
      // Wraps the batch buffer without copying; it outlives infer().
      ov::Tensor tensor(type, shape, const_cast<char*>(in.data.data()));
      request.set_input_tensor(input_ports_[i], tensor);
    }
    request.infer();
    outputs->clear();
    for (size_t j = 0; j < output_ports_.size(); ++j) {
      const ov::Tensor result = request.get_output_tensor(output_ports_[j]);
      Tensor out;
      out.name = options_.outputs[j].name;
      out.dtype = options_.outputs[j].dtype;
      const ov::Shape shape = result.get_shape();
      out.shape.assign(shape.begin(), shape.end());
      ASSIGN_OR_RETURN(const auto want, ToOvType(out.dtype));
      if (result.get_element_type() != want) {
        return Internal("output '" + out.name + "' is " +
                        result.get_element_type().get_type_name() +
                        " but signature.json declares " +
                        DataTypeName(out.dtype));
      }
      const auto* data = static_cast<const char*>(result.data());
      out.data.assign(data, data + result.get_byte_size());
      outputs->push_back(std::move(out));
    }
  } catch (const std::exception& e) {
    return Internal(std::string("OpenVINO inference failed: ") +
                    FirstLine(e.what()));
  }
  return Status::Ok();
}

}  // namespace serving

#include "signature.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace serving {
namespace {

using json = nlohmann::json;

Status ParseSpecs(const json& root, const char* key,
                  std::vector<TensorSpec>* specs) {
  const auto it = root.find(key);
  if (it == root.end() || !it->is_array() || it->empty()) {
    return InvalidArgument(std::string("signature needs a non-empty '") + key +
                           "' list");
  }
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") ||
        !entry["name"].is_string() || !entry.contains("shape") ||
        !entry["shape"].is_array()) {
      return InvalidArgument(std::string("each '") + key +
                             "' entry needs a string 'name' and a 'shape'");
    }
    TensorSpec spec;
    spec.name = entry["name"].get<std::string>();
    const std::string dtype =
        entry.contains("dtype") && entry["dtype"].is_string()
            ? entry["dtype"].get<std::string>()
            : "float32";
    spec.dtype = DataTypeFromNumpyName(dtype);
    if (spec.dtype == DataType::kInvalid) {
      spec.dtype = DataTypeFromName(dtype);  // also accept "FP32"
    }
    if (spec.dtype == DataType::kInvalid) {
      return InvalidArgument("tensor '" + spec.name + "': unknown dtype '" +
                             dtype + "'");
    }
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < -1) {
        return InvalidArgument("tensor '" + spec.name +
                               "': shape dims must be integers >= -1");
      }
      spec.shape.push_back(dim.get<int64_t>());
    }
    specs->push_back(std::move(spec));
  }
  return Status::Ok();
}

std::vector<std::string> StringList(const json& object, const char* key) {
  std::vector<std::string> out;
  const auto it = object.find(key);
  if (it == object.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

StatusOr<ModelSignature> ModelSignature::Parse(const std::string& text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    return InvalidArgument(std::string("signature is not valid JSON: ") +
                           e.what());
  }
  if (!root.is_object()) {
    return InvalidArgument("signature must be a JSON object");
  }
  ModelSignature sig;
  if (root.contains("task") && root["task"].is_string()) {
    sig.task = root["task"].get<std::string>();
  }
  RETURN_IF_ERROR(ParseSpecs(root, "inputs", &sig.inputs));
  RETURN_IF_ERROR(ParseSpecs(root, "outputs", &sig.outputs));
  sig.label_names = StringList(root, "label_names");
  if (const auto it = root.find("formats");
      it != root.end() && it->is_object()) {
    for (auto f = it->begin(); f != it->end(); ++f) {
      if (!f.value().is_object()) continue;
      ModelFormat format;
      const json& value = f.value();
      if (value.contains("program") && value["program"].is_string()) {
        format.program = value["program"].get<std::string>();
      }
      if (value.contains("params") && value["params"].is_string()) {
        format.params = value["params"].get<std::string>();
      }
      format.input_names = StringList(value, "input_names");
      format.output_names = StringList(value, "output_names");
      sig.formats[f.key()] = std::move(format);
    }
  }
  return sig;
}

StatusOr<ModelSignature> ModelSignature::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read model signature " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto sig = Parse(buffer.str());
  if (!sig.ok()) {
    return Status(sig.status().code(), path + ": " + sig.status().message());
  }
  return sig;
}

}  // namespace serving

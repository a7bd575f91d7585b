#include "tensor.h"

#include <utility>

namespace serving {
namespace {

struct DataTypeInfo {
  DataType dtype;
  const char* name;
  const char* numpy;
  size_t size;
};

constexpr DataTypeInfo kDataTypes[] = {
    {DataType::kBool, "BOOL", "bool", 1},
    {DataType::kUint8, "UINT8", "uint8", 1},
    {DataType::kUint16, "UINT16", "uint16", 2},
    {DataType::kUint32, "UINT32", "uint32", 4},
    {DataType::kUint64, "UINT64", "uint64", 8},
    {DataType::kInt8, "INT8", "int8", 1},
    {DataType::kInt16, "INT16", "int16", 2},
    {DataType::kInt32, "INT32", "int32", 4},
    {DataType::kInt64, "INT64", "int64", 8},
    {DataType::kFp16, "FP16", "float16", 2},
    {DataType::kBf16, "BF16", "bfloat16", 2},
    {DataType::kFp32, "FP32", "float32", 4},
    {DataType::kFp64, "FP64", "float64", 8},
    {DataType::kBytes, "BYTES", "object", 0},
};

}  // namespace

DataType DataTypeFromName(const std::string& name) {
  for (const auto& info : kDataTypes) {
    if (name == info.name) return info.dtype;
  }
  return DataType::kInvalid;
}

const char* DataTypeName(DataType dtype) {
  for (const auto& info : kDataTypes) {
    if (dtype == info.dtype) return info.name;
  }
  return "INVALID";
}

DataType DataTypeFromNumpyName(const std::string& name) {
  for (const auto& info : kDataTypes) {
    if (name == info.numpy) return info.dtype;
  }
  return DataType::kInvalid;
}

size_t DataTypeByteSize(DataType dtype) {
  for (const auto& info : kDataTypes) {
    if (dtype == info.dtype) return info.size;
  }
  return 0;
}

int64_t ElementCount(const Shape& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return -1;
    count *= dim;
  }
  return count;
}

std::string ShapeToString(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

Tensor Tensor::Allocate(std::string name, DataType dtype, Shape shape) {
  Tensor tensor;
  tensor.name = std::move(name);
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  const int64_t count = ElementCount(tensor.shape);
  tensor.data.assign(
      static_cast<size_t>(count < 0 ? 0 : count) * DataTypeByteSize(dtype), 0);
  return tensor;
}

}  // namespace serving

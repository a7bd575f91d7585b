// Tensors, their specs and the KServe v2 datatype names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace serving {

enum class DataType {
  kInvalid,
  kBool,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
  kBytes,
};

// KServe v2 name ("FP32") <-> DataType; kInvalid if unknown.
DataType DataTypeFromName(const std::string& name);
const char* DataTypeName(DataType dtype);
// numpy/paddle style name from signature.json ("float32") -> DataType.
DataType DataTypeFromNumpyName(const std::string& name);
// Bytes per element; 0 for BYTES and kInvalid (variable size).
size_t DataTypeByteSize(DataType dtype);

using Shape = std::vector<int64_t>;

// Product of the dims (1 for a scalar); -1 if any dim is negative.
int64_t ElementCount(const Shape& shape);
// "[-1,1,28,28]"
std::string ShapeToString(const Shape& shape);

// Declared input/output of a served model. -1 marks a dynamic dimension;
// dim 0 is the batch dimension.
struct TensorSpec {
  std::string name;
  DataType dtype = DataType::kInvalid;
  Shape shape;
};

// A dense, row-major, host tensor that owns its bytes.
struct Tensor {
  std::string name;
  DataType dtype = DataType::kInvalid;
  Shape shape;
  std::vector<char> data;

  int64_t element_count() const { return ElementCount(shape); }
  size_t byte_size() const { return data.size(); }

  template <typename T>
  T* data_as() {
    return reinterpret_cast<T*>(data.data());
  }
  template <typename T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data.data());
  }

  // Allocates zeroed storage for `shape` (fixed-size dtypes only).
  static Tensor Allocate(std::string name, DataType dtype, Shape shape);
};

}  // namespace serving

#include "dtrain/comm/communicator.h"

#include <fmt/format.h>

namespace dtrain::comm {

size_t elementSize(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return 4;
    case DataType::Float64: return 8;
    case DataType::Float16: return 2;
    case DataType::BFloat16: return 2;
    case DataType::Int32: return 4;
    case DataType::Int64: return 8;
    case DataType::UInt8: return 1;
    case DataType::Int8: return 1;
  }
  return 0;
}

const char* dataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
    case DataType::Float16: return "float16";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
    case DataType::UInt8: return "uint8";
    case DataType::Int8: return "int8";
  }
  return "unknown";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "unknown";
}

std::string Communicator::describe() const {
  return fmt::format("{} rank {}/{}", backendName(), rank(), size());
}

}  // namespace dtrain::comm

// Template definitions for tensor.hpp; include tensor.hpp, not this file.
#pragma once

#include <stdexcept>
#include <string>

namespace headgrad {

[[noreturn]] void throw_dtype_mismatch(DType have, DType want);
[[noreturn]] void throw_not_float(DType have, const char* op);

template <class T>
const T* Tensor::data() const {
  if (dtype_ != dtype_of<T>()) throw_dtype_mismatch(dtype_, dtype_of<T>());
  return static_cast<const T*>(storage_->data()) + offset_;
}

template <class T>
T* Tensor::mutable_data() {
  if (dtype_ != dtype_of<T>()) throw_dtype_mismatch(dtype_, dtype_of<T>());
  return static_cast<T*>(storage_->mutable_data()) + offset_;
}

template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::float32: return f.template operator()<float>();
    case DType::float64: return f.template operator()<double>();
    default: throw_not_float(dtype, op);
  }
}

}  // namespace headgrad

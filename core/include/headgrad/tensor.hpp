// headgrad tensors: a shape, strides and an offset over shared storage.
//
//   Tensor x = Tensor::zeros({2, 3, 4}, DType::float64);   // [B, T, D]
//   Tensor xt = x.transpose(1, 2);       // [B, D, T], a view: no copy
//   Tensor y = xt.contiguous();          // copies, row-major
//   Tensor z = x.view({2, 12});          // a view: x is contiguous
//   xt.view({2, 12});                    // throws: strides forbid it, use reshape()
//
// Strides and offsets are in elements, not bytes. Views share storage; any
// write through one view is seen by all of them (as in PyTorch).
//
// In-place writes are explicit: data<T>() is read-only, mutable_data<T>(),
// set, set_flat, fill_ and copy_ write, and every write bumps the storage's
// version. The autograd graph records the version of each tensor an op saves
// and refuses a backward that would read one written since (PyTorch's rule).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "headgrad/half.hpp"
#include "headgrad/shape.hpp"

namespace headgrad {

// bfloat16 and float16 are storage types (headgrad/half.hpp): ops compute in
// float32 and round each result to them. New enumerators go at the end (the
// plugin ABI pins the values).
enum class DType : std::uint8_t { float32, float64, boolean, bfloat16, float16 };

std::size_t dtype_size(DType dtype);
// "float32", "float64", "bool", "bfloat16", "float16"
std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name);  // throws std::invalid_argument
// bfloat16 or float16: the dtypes whose arithmetic runs in float32.
constexpr bool is_16bit(DType dtype) { return dtype == DType::bfloat16 || dtype == DType::float16; }
// float32 for a 16-bit dtype (the type its ops compute in), else dtype itself.
constexpr DType compute_dtype(DType dtype) { return is_16bit(dtype) ? DType::float32 : dtype; }

std::string shape_str(std::span<const std::int64_t> shape);  // "[2, 3, 4]"
// Sizes are checked, never wrapped: these throw std::invalid_argument naming
// the shape for a negative size, or when the product of the sizes (each taken
// as at least 1) overflows int64.
std::int64_t shape_numel(std::span<const std::int64_t> shape);
Shape contiguous_strides(std::span<const std::int64_t> shape);
// The index of row-major element `flat` of `shape`: 5 of [2, 3] is [1, 2].
// Throws std::out_of_range unless 0 <= flat < shape_numel(shape).
Shape unravel_index(std::int64_t flat, std::span<const std::int64_t> shape);
// Dim `d` of an `ndim`-dim tensor, negative counting from the end (-1: the
// last); throws std::invalid_argument naming `op` and `shape` when out of range.
std::int64_t normalize_dim(std::int64_t d, std::int64_t ndim, std::span<const std::int64_t> shape, const char* op);
// A stack of matrices [..., r, c]: its leading dims [...], and lead + [rows, cols].
Shape lead_dims(std::span<const std::int64_t> shape);
Shape with_last2(Shape lead, std::int64_t rows, std::int64_t cols);

// Bytes owned by one or more tensors. Every allocation is counted so that the
// engine's peak memory can be measured (benchmarks, the fused core's tests).
// Buffers come from a caching allocator (size-class free lists, huge-page
// aligned large buffers); HEADGRAD_ALLOCATOR=system bypasses the cache.
class Storage {
 public:
  explicit Storage(std::size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  const void* data() const { return data_; }
  // The pointer to write through: taking it counts as a write (bumps version()).
  void* mutable_data() {
    version_.fetch_add(1, std::memory_order_relaxed);
    return data_;
  }
  std::size_t nbytes() const { return nbytes_; }
  // How many times a writable pointer was taken: 0 for fresh storage.
  std::uint64_t version() const { return version_.load(std::memory_order_relaxed); }

 private:
  void* data_;
  std::size_t nbytes_;
  std::size_t capacity_ = 0;  // the allocator's size class, >= nbytes_
  std::atomic<std::uint64_t> version_{0};
};

struct MemoryStats {
  std::size_t current_bytes;  // held by live tensors (as they asked for them)
  std::size_t peak_bytes;     // the most current_bytes reached since the last reset
  // The allocator's side: free buffers kept for reuse, and everything taken from
  // the system (live size classes + cached), with its peak.
  std::size_t cached_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
};
MemoryStats memory_stats();
void reset_peak_memory();  // peak := current (both peaks)
// Returns every cached free buffer to the system (live tensors are untouched).
void empty_cache();
std::string_view allocator_name();  // "caching" or "system" (HEADGRAD_ALLOCATOR)

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage
  // Throws std::invalid_argument when the shape is invalid (see shape_numel)
  // or an element would lie outside the storage.
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, std::int64_t offset,
         DType dtype);

  // Throws std::invalid_argument, before allocating, for an invalid shape or
  // one whose bytes int64 cannot count (as do zeros, full and the others).
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor full(const Shape& shape, double value, DType dtype);
  static Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
  // Values in row-major order; throws if their count is not the shape's.
  static Tensor from_values(std::span<const double> values, const Shape& shape, DType dtype);
  static Tensor scalar(double value, DType dtype) { return full({}, value, dtype); }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t offset() const { return offset_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t d) const;  // d may be negative, counted from the end
  std::int64_t stride(std::int64_t d) const;
  std::int64_t numel() const { return shape_numel(shape_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // Pointer to the first element (the offset applied). T must match dtype().
  template <class T>
  const T* data() const;
  // The same, to write through: bumps the storage's version (see above).
  template <class T>
  T* mutable_data();
  std::uint64_t version() const { return storage_ ? storage_->version() : 0; }

  // ---- views: no copy ----
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  Tensor permute(const Shape& dims) const;
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  // A view with a new shape; one size may be -1. Throws std::invalid_argument
  // when the strides cannot express it (suggesting reshape() or contiguous()).
  Tensor view(const Shape& shape) const;
  std::optional<Tensor> try_view(const Shape& shape) const;  // empty instead of throwing
  // Broadcast size-1 dims (and new leading dims) with stride 0.
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(std::int64_t dim) const;
  Tensor squeeze(std::int64_t dim) const;

  // ---- copies only when needed ----
  Tensor reshape(const Shape& shape) const;  // view() when possible, else a copy
  Tensor contiguous() const;                 // *this when already contiguous

  // ---- copies ----
  Tensor clone() const;            // contiguous copy
  Tensor to(DType dtype) const;    // converted contiguous copy (or *this if same dtype)

  // ---- elements ----
  double item() const;  // one element tensors only
  double at(std::span<const std::int64_t> index) const;
  double at(std::initializer_list<std::int64_t> index) const {
    return at(std::span<const std::int64_t>(index.begin(), index.size()));
  }
  void set(std::span<const std::int64_t> index, double value);
  void set(std::initializer_list<std::int64_t> index, double value) {
    set(std::span<const std::int64_t>(index.begin(), index.size()), value);
  }
  double flat(std::int64_t i) const;  // i-th element in row-major order
  void set_flat(std::int64_t i, double value);
  std::int64_t flat_to_offset(std::int64_t i) const;  // storage element offset of the i-th element

  void fill_(double value);
  void copy_(const Tensor& src);  // same shape, any strides and dtypes
  std::vector<double> to_vector() const;  // row-major

  std::string repr() const;  // "Tensor(float64, [2, 3], strides [3, 1])"

 private:
  std::int64_t normalize_dim(std::int64_t d, std::int64_t ndim, const char* op) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  std::int64_t offset_ = 0;
  DType dtype_ = DType::float64;
};

// C++ type <-> DType
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::float32; }
template <>
constexpr DType dtype_of<double>() { return DType::float64; }
template <>
constexpr DType dtype_of<bool>() { return DType::boolean; }
template <>
constexpr DType dtype_of<BFloat16>() { return DType::bfloat16; }
template <>
constexpr DType dtype_of<Float16>() { return DType::float16; }

// A random stream that is identical on every machine: SplitMix64 for bits,
// Box-Muller over doubles for normals (std::normal_distribution is
// implementation defined, so it is never used).
class Generator {
 public:
  explicit Generator(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64();
  double uniform();  // [0, 1) with 53 random bits
  double normal();   // mean 0, standard deviation 1
  // The values of n calls of normal(), the stream left as they leave it,
  // computed on every worker (randn): sink(i, values, count) for runs of
  // consecutive indices [i, i + count) that together cover [0, n) once
  // (values: double*, the sink's to change).
  template <class Sink>
  void normals(std::int64_t n, Sink&& sink);

 private:
  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

Tensor randn(const Shape& shape, DType dtype, Generator& gen, double stddev = 1.0);
Tensor rand_uniform(const Shape& shape, DType dtype, Generator& gen, double lo, double hi);

// Calls f.template operator()<T>() with T = float or double for dtype. The
// 16-bit dtypes are not dispatched here: a kernel converts them to float32
// around its float32 body (kernels.cpp), so arithmetic is never done in 16 bits.
template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f);

}  // namespace headgrad

#include "headgrad/tensor_inl.hpp"

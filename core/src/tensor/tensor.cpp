#include "headgrad/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "headgrad/half_convert.hpp"
#include "headgrad/parallel.hpp"
#include "tensor/strided.hpp"

namespace headgrad {

// ---------------------------------------------------------------- dtypes, shapes

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::boolean: return 1;
    case DType::bfloat16: return 2;
    case DType::float16: return 2;
  }
  throw std::logic_error("dtype_size: unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::boolean: return "bool";
    case DType::bfloat16: return "bfloat16";
    case DType::float16: return "float16";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  if (name == "float32") return DType::float32;
  if (name == "float64") return DType::float64;
  if (name == "bool") return DType::boolean;
  if (name == "bfloat16") return DType::bfloat16;
  if (name == "float16") return DType::float16;
  throw std::invalid_argument("unknown dtype '" + std::string(name) +
                              "' (expected float32, float64, bfloat16, float16 or bool)");
}

void throw_dtype_mismatch(DType have, DType want) {
  throw std::invalid_argument("tensor holds " + std::string(dtype_name(have)) + ", accessed as " +
                              std::string(dtype_name(want)));
}

void throw_not_float(DType have, const char* op) {
  throw std::invalid_argument(std::string(op) + ": expected a float32 or float64 tensor, got " +
                              std::string(dtype_name(have)));
}

std::string shape_str(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {
// The product of the sizes, each taken as at least 1 (what the outermost
// contiguous stride would be), or an error naming the shape: sizes are checked
// here, never wrapped. Negative sizes are rejected.
std::int64_t extent_product(std::span<const std::int64_t> shape, bool& has_zero) {
  std::int64_t n = 1;
  has_zero = false;
  for (auto s : shape) {
    if (s < 0) throw std::invalid_argument("shape " + shape_str(shape) + " has a negative size");
    has_zero = has_zero || s == 0;
    if (__builtin_mul_overflow(n, std::max<std::int64_t>(s, 1), &n))
      throw std::invalid_argument("shape " + shape_str(shape) +
                                  ": the product of its sizes overflows int64");
  }
  return n;
}
}  // namespace

std::int64_t shape_numel(std::span<const std::int64_t> shape) {
  bool has_zero = false;
  const std::int64_t n = extent_product(shape, has_zero);
  return has_zero ? 0 : n;
}

Shape unravel_index(std::int64_t flat, std::span<const std::int64_t> shape) {
  if (flat < 0 || flat >= shape_numel(shape))
    throw std::out_of_range("unravel_index: flat index " + std::to_string(flat) +
                            " out of range for shape " + shape_str(shape));
  Shape index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

Shape contiguous_strides(std::span<const std::int64_t> shape) {
  bool has_zero = false;
  (void)extent_product(shape, has_zero);  // every partial product below then fits
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

// ---------------------------------------------------------------- storage
// Storage, memory_stats and the caching allocator: allocator.cpp.

// ---------------------------------------------------------------- construction

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, std::int64_t offset,
               DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype) {
  if (shape_.size() != strides_.size())
    throw std::logic_error("Tensor: shape " + shape_str(shape_) + " and strides " +
                           shape_str(strides_) + " differ in rank");
  if (shape_numel(shape_) == 0 || !storage_) return;  // validates the sizes
  // Every element must lie inside the storage: the lowest and highest element
  // offsets, computed without wrapping, so that no later index can wrap.
  std::int64_t lo = offset_, hi = offset_;
  bool wrapped = offset_ < 0;
  for (std::size_t d = 0; d < shape_.size() && !wrapped; ++d) {
    std::int64_t reach = 0;
    wrapped = __builtin_mul_overflow(shape_[d] - 1, strides_[d], &reach) ||
              __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
  }
  const auto capacity = static_cast<std::int64_t>(storage_->nbytes() / dtype_size(dtype_));
  if (wrapped || lo < 0 || hi >= capacity)
    throw std::invalid_argument("Tensor: shape " + shape_str(shape_) + " with strides " +
                                shape_str(strides_) + " and offset " + std::to_string(offset_) +
                                " reaches outside its storage of " + std::to_string(capacity) +
                                " " + std::string(dtype_name(dtype_)) + " elements");
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  const std::int64_t n = shape_numel(shape);  // rejects negative and overflowing sizes
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  if (n > std::numeric_limits<std::int64_t>::max() / elem)
    throw std::invalid_argument("Tensor::empty: shape " + shape_str(shape) + " of " +
                                std::string(dtype_name(dtype)) +
                                " needs more bytes than int64 can count");
  auto storage = std::make_shared<Storage>(static_cast<std::size_t>(n * elem));
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.storage_->mutable_data(), 0, t.storage_->nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_values(std::span<const double> values, const Shape& shape, DType dtype) {
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("Tensor::from_values: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (std::size_t i = 0; i < values.size(); ++i) t.set_flat(static_cast<std::int64_t>(i), values[i]);
  return t;
}

// ---------------------------------------------------------------- geometry

std::int64_t normalize_dim(std::int64_t d, std::int64_t ndim, std::span<const std::int64_t> shape, const char* op) {
  const std::int64_t r = d < 0 ? d + ndim : d;
  if (r < 0 || r >= ndim)
    throw std::invalid_argument(std::string(op) + ": dim " + std::to_string(d) +
                                " out of range for shape " + shape_str(shape));
  return r;
}

Shape lead_dims(std::span<const std::int64_t> shape) {
  if (shape.size() < 2)
    throw std::invalid_argument("lead_dims: shape " + shape_str(shape) + " is not a stack of matrices [..., r, c]");
  return Shape(shape.begin(), shape.end() - 2);
}

Shape with_last2(Shape lead, std::int64_t rows, std::int64_t cols) {
  lead.push_back(rows);
  lead.push_back(cols);
  return lead;
}

std::int64_t Tensor::normalize_dim(std::int64_t d, std::int64_t ndim, const char* op) const {
  return headgrad::normalize_dim(d, ndim, shape_, op);
}

std::int64_t Tensor::size(std::int64_t d) const { return shape_[normalize_dim(d, dim(), "size")]; }
std::int64_t Tensor::stride(std::int64_t d) const {
  return strides_[normalize_dim(d, dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

// ---------------------------------------------------------------- views

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  d0 = normalize_dim(d0, dim(), "transpose");
  d1 = normalize_dim(d1, dim(), "transpose");
  Shape shape = shape_, strides = strides_;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::permute(const Shape& dims) const {
  if (static_cast<std::int64_t>(dims.size()) != dim())
    throw std::invalid_argument("permute: dims " + shape_str(dims) + " do not match shape " +
                                shape_str(shape_));
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    std::int64_t d = normalize_dim(dims[i], dim(), "permute");
    if (seen[d]) throw std::invalid_argument("permute: dims " + shape_str(dims) + " repeat a dim");
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  d = normalize_dim(d, dim(), "narrow");
  if (start < 0 || length < 0 || start > shape_[d] || length > shape_[d] - start) {
    std::int64_t end = 0;
    const std::string end_str = __builtin_add_overflow(start, length, &end)
                                    ? std::to_string(start) + " + " + std::to_string(length)
                                    : std::to_string(end);
    throw std::invalid_argument("narrow: [" + std::to_string(start) + ", " + end_str +
                                ") out of range for dim " + std::to_string(d) + " of shape " +
                                shape_str(shape_));
  }
  Shape shape = shape_;
  shape[d] = length;
  return Tensor(storage_, std::move(shape), strides_, offset_ + start * strides_[d], dtype_);
}

namespace {
Shape infer_shape(const Shape& requested, std::int64_t numel, const Shape& from, const char* op) {
  Shape shape = requested;
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw std::invalid_argument(std::string(op) + ": more than one -1 in " +
                                                  shape_str(requested));
      infer = static_cast<std::int64_t>(i);
    } else if (shape[i] < 0) {
      throw std::invalid_argument(std::string(op) + ": negative size in " + shape_str(requested));
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      throw std::invalid_argument(std::string(op) + ": shape " + shape_str(requested) +
                                  ": the product of its sizes overflows int64");
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw std::invalid_argument(std::string(op) + ": cannot infer -1 in " +
                                  shape_str(requested) + " from shape " + shape_str(from));
    shape[infer] = numel / known;
    known *= shape[infer];
  }
  if (known != numel)
    throw std::invalid_argument(std::string(op) + ": shape " + shape_str(requested) +
                                " does not hold the " + std::to_string(numel) +
                                " elements of shape " + shape_str(from));
  return shape;
}

// PyTorch's computeStride: split the old dims into chunks that are contiguous
// among themselves; each chunk may be re-split freely. False when the new
// shape would need elements of two chunks to interleave.
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape,
                  Shape& new_strides) {
  new_strides.assign(new_shape.size(), 0);
  // No elements, or a 0-dim scalar (whose new shape is all 1s): any strides do.
  if (shape_numel(old_shape) == 0 || old_shape.empty()) {
    new_strides = contiguous_strides(new_shape);
    return true;
  }
  std::int64_t view_d = static_cast<std::int64_t>(new_shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t tensor_d = static_cast<std::int64_t>(old_shape.size()) - 1; tensor_d >= 0;
       --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 &&
         old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), shape_, "view");
  Shape strides;
  if (!view_strides(shape_, strides_, shape, strides))
    throw std::invalid_argument(
        "view: a tensor of shape " + shape_str(shape_) + " with strides " + shape_str(strides_) +
        " cannot be viewed as " + shape_str(shape) +
        " without a copy (its strides mix the dims being merged or split); use reshape(), or "
        "contiguous() then view()");
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

std::optional<Tensor> Tensor::try_view(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), shape_, "view");
  Shape strides;
  if (!view_strides(shape_, strides_, shape, strides)) return std::nullopt;
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::reshape(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), shape_, "reshape");
  Shape strides;
  if (view_strides(shape_, strides_, shape, strides))
    return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
  return contiguous().view(shape);
}

Tensor Tensor::expand(const Shape& shape) const {
  if (shape.size() < shape_.size())
    throw std::invalid_argument("expand: cannot expand shape " + shape_str(shape_) + " to " +
                                shape_str(shape));
  const std::size_t lead = shape.size() - shape_.size();
  Shape strides(shape.size(), 0);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) continue;  // new leading dims: stride 0
    std::int64_t have = shape_[i - lead];
    if (have == shape[i]) {
      strides[i] = strides_[i - lead];
    } else if (have != 1) {
      throw std::invalid_argument("expand: cannot expand shape " + shape_str(shape_) + " to " +
                                  shape_str(shape) + " (dim " + std::to_string(i) +
                                  " is neither equal nor 1)");
    }
  }
  return Tensor(storage_, shape, std::move(strides), offset_, dtype_);
}

Tensor Tensor::unsqueeze(std::int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape shape = shape_, strides = strides_;
  // The new size-1 dim's stride is free; this one keeps the tensor contiguous
  // when it was (1 where the product would wrap: a zero-element tensor's strides).
  std::int64_t st = 1;
  if (d < dim() && __builtin_mul_overflow(strides_[d], shape_[d], &st)) st = 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::squeeze(std::int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (shape_[d] != 1)
    throw std::invalid_argument("squeeze: dim " + std::to_string(d) + " of shape " +
                                shape_str(shape_) + " is not 1");
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

// ---------------------------------------------------------------- copies

namespace {
// One element from Src to Dst: 16-bit types go through float32 (exact), and
// into 16 bits with one round-to-nearest-even (float64 included, see half.hpp).
template <class T>
float widen(T v) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>)
    return to_float(v);
  else
    return static_cast<float>(v);
}
template <class Dst, class Src>
Dst convert(Src v) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return v;
  } else if constexpr (std::is_same_v<Dst, BFloat16> || std::is_same_v<Dst, Float16>) {
    const auto narrow = [](auto x) {
      if constexpr (std::is_same_v<Dst, BFloat16>) {
        if constexpr (std::is_same_v<decltype(x), double>) return bfloat16_from_double(x);
        else return bfloat16_from_float(x);
      } else {
        if constexpr (std::is_same_v<decltype(x), double>) return float16_from_double(x);
        else return float16_from_float(x);
      }
    };
    if constexpr (std::is_same_v<Src, double>) return narrow(v);
    else return narrow(widen(v));
  } else if constexpr (std::is_same_v<Src, BFloat16> || std::is_same_v<Src, Float16>) {
    return static_cast<Dst>(to_float(v));
  } else {
    return static_cast<Dst>(v);
  }
}

// float32 <-> bfloat16 / float16 and float64 -> 16-bit: the bulk loops of half_convert.hpp (vector
// paths, bit for bit the scalar rule).
template <class Dst, class Src>
constexpr bool kBulkHalf = (std::is_same_v<Dst, float> && (std::is_same_v<Src, BFloat16> || std::is_same_v<Src, Float16>)) ||
                           ((std::is_same_v<Src, float> || std::is_same_v<Src, double>) &&
                            (std::is_same_v<Dst, BFloat16> || std::is_same_v<Dst, Float16>));

template <class Dst, class Src>
void copy_typed(const Tensor& dst, const Tensor& src) {
  Dst* d = static_cast<Dst*>(dst.storage()->mutable_data());
  const Src* s = static_cast<const Src*>(src.storage()->data());
  if constexpr (kBulkHalf<Dst, Src>) {
    const Shape& shape = dst.shape();
    const std::int64_t inner = shape.empty() ? 1 : shape.back();
    if (dst.is_contiguous() && src.is_contiguous()) {
      Dst* dp = d + dst.offset();
      const Src* sp = s + src.offset();
      parallel_for(
          dst.numel(),
          [&](std::int64_t i0, std::int64_t i1, int) {
            convert(sp + i0, dp + i0, static_cast<std::size_t>(i1 - i0));
          },
          detail::kParallelMinElements);
      return;
    }
    // Rows contiguous in both (a head-split view, a narrowed one): row by row.
    bool dst_repeats = false;  // a stride-0 dim of size > 1: written in serial order below
    for (std::size_t k = 0; k < shape.size(); ++k) dst_repeats |= shape[k] > 1 && dst.strides()[k] == 0;
    if (!shape.empty() && inner >= 16 && !dst_repeats && dst.strides().back() == 1 && src.strides().back() == 1) {
      Shape rows_shape(shape.begin(), shape.end() - 1);
      rows_shape.push_back(1);  // one call per row: the walk's innermost dim is the row itself
      const Shape& dst_strides = dst.strides();
      const Shape& src_strides = src.strides();
      const std::int64_t rows = detail::row_count(rows_shape);
      parallel_for(
          rows,
          [&](std::int64_t r0, std::int64_t r1, int) {
            detail::for_each_offsets_rows<2>(rows_shape, {dst_strides, src_strides}, {dst.offset(), src.offset()},
                                             r0, r1, [&](const std::array<std::int64_t, 2>& o) {
                                               convert(s + o[1], d + o[0], static_cast<std::size_t>(inner));
                                             });
          },
          std::max<std::int64_t>(1, detail::kParallelMinElements / inner));
      return;
    }
  }
  if (dst.is_contiguous() && src.is_contiguous()) {
    Dst* dp = d + dst.offset();
    const Src* sp = s + src.offset();
    detail::parallel_elements(dst.numel(), [&](std::int64_t i) { dp[i] = convert<Dst>(sp[i]); });
    return;
  }
  detail::parallel_for_each_offsets<2>(dst.shape(), {dst.strides(), src.strides()},
                                       {dst.offset(), src.offset()},
                                       [&](const std::array<std::int64_t, 2>& o) {
                                         d[o[0]] = convert<Dst>(s[o[1]]);
                                       });
}

template <class F>
void dispatch_any(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: f.template operator()<float>(); break;
    case DType::float64: f.template operator()<double>(); break;
    case DType::boolean: f.template operator()<bool>(); break;
    case DType::bfloat16: f.template operator()<BFloat16>(); break;
    case DType::float16: f.template operator()<Float16>(); break;
  }
}
}  // namespace

void Tensor::copy_(const Tensor& src) {
  if (src.shape_ != shape_)
    throw std::invalid_argument("copy_: source shape " + shape_str(src.shape_) +
                                " differs from destination shape " + shape_str(shape_));
  dispatch_any(dtype_, [&]<class D>() {
    dispatch_any(src.dtype_, [&]<class S>() { copy_typed<D, S>(*this, src); });
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype);
  out.copy_(*this);
  return out;
}

// ---------------------------------------------------------------- elements

std::int64_t Tensor::flat_to_offset(std::int64_t i) const {
  if (i < 0 || i >= numel())
    throw std::out_of_range("flat index " + std::to_string(i) + " out of range for shape " +
                            shape_str(shape_));
  std::int64_t off = offset_;
  for (std::size_t d = shape_.size(); d-- > 0;) {
    off += (i % shape_[d]) * strides_[d];
    i /= shape_[d];
  }
  return off;
}

namespace {
double read_at(const Tensor& t, std::int64_t off) {
  switch (t.dtype()) {
    case DType::float32: return static_cast<const float*>(t.storage()->data())[off];
    case DType::float64: return static_cast<const double*>(t.storage()->data())[off];
    case DType::boolean: return static_cast<const bool*>(t.storage()->data())[off] ? 1.0 : 0.0;
    case DType::bfloat16: return to_float(static_cast<const BFloat16*>(t.storage()->data())[off]);
    case DType::float16: return to_float(static_cast<const Float16*>(t.storage()->data())[off]);
  }
  return 0.0;
}
// v rounded to dtype at element `off` of `base`.
void write_to(void* base, DType dtype, std::int64_t off, double v) {
  switch (dtype) {
    case DType::float32: static_cast<float*>(base)[off] = static_cast<float>(v); break;
    case DType::float64: static_cast<double*>(base)[off] = v; break;
    case DType::boolean: static_cast<bool*>(base)[off] = v != 0.0; break;
    case DType::bfloat16: static_cast<BFloat16*>(base)[off] = bfloat16_from_double(v); break;
    case DType::float16: static_cast<Float16*>(base)[off] = float16_from_double(v); break;
  }
}
void write_at(const Tensor& t, std::int64_t off, double v) { write_to(t.storage()->mutable_data(), t.dtype(), off, v); }
}  // namespace

double Tensor::item() const {
  if (numel() != 1)
    throw std::invalid_argument("item: tensor of shape " + shape_str(shape_) +
                                " has more than one element");
  return read_at(*this, offset_);
}

double Tensor::at(std::span<const std::int64_t> index) const {
  if (static_cast<std::int64_t>(index.size()) != dim())
    throw std::invalid_argument("at: index of rank " + std::to_string(index.size()) +
                                " for shape " + shape_str(shape_));
  std::int64_t off = offset_;
  for (std::size_t d = 0; d < index.size(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d])
      throw std::out_of_range("at: index " + shape_str(index) + " out of range for shape " +
                              shape_str(shape_));
    off += index[d] * strides_[d];
  }
  return read_at(*this, off);
}

void Tensor::set(std::span<const std::int64_t> index, double value) {
  if (static_cast<std::int64_t>(index.size()) != dim())
    throw std::invalid_argument("set: index of rank " + std::to_string(index.size()) +
                                " for shape " + shape_str(shape_));
  std::int64_t off = offset_;
  for (std::size_t d = 0; d < index.size(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d])
      throw std::out_of_range("set: index " + shape_str(index) + " out of range for shape " +
                              shape_str(shape_));
    off += index[d] * strides_[d];
  }
  write_at(*this, off, value);
}

double Tensor::flat(std::int64_t i) const { return read_at(*this, flat_to_offset(i)); }
void Tensor::set_flat(std::int64_t i, double value) { write_at(*this, flat_to_offset(i), value); }

void Tensor::fill_(double value) {
  dispatch_any(dtype_, [&]<class T>() {
    T* base = static_cast<T*>(storage_->mutable_data());
    const T v = convert<T>(value);
    detail::for_each_offsets<1>(shape_, {strides_}, {offset_},
                                [&](const std::array<std::int64_t, 1>& o) { base[o[0]] = v; });
  });
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> out;
  if (is_contiguous() && dtype_ != DType::boolean) {  // the judge reads whole gradients: no per-element dispatch
    out.resize(static_cast<std::size_t>(numel()));
    const void* base = storage_->data();
    double* o = out.data();
    switch (dtype_) {
      case DType::float64: {
        const double* p = static_cast<const double*>(base) + offset_;
        std::copy(p, p + numel(), o);
        return out;
      }
      case DType::float32: {
        const float* p = static_cast<const float*>(base) + offset_;
        std::copy(p, p + numel(), o);
        return out;
      }
      default: {  // 16 bits: the bulk widening in chunks, then exact to double
        constexpr std::int64_t kChunk = 4096;
        float buf[kChunk];
        for (std::int64_t i = 0; i < numel(); i += kChunk) {
          const std::int64_t n = std::min(kChunk, numel() - i);
          if (dtype_ == DType::bfloat16) convert(static_cast<const BFloat16*>(base) + offset_ + i, buf, std::size_t(n));
          else convert(static_cast<const Float16*>(base) + offset_ + i, buf, std::size_t(n));
          std::copy(buf, buf + n, o + i);
        }
        return out;
      }
    }
  }
  out.reserve(static_cast<std::size_t>(numel()));
  detail::for_each_offsets<1>(shape_, {strides_}, {offset_},
                              [&](const std::array<std::int64_t, 1>& o) {
                                out.push_back(read_at(*this, o[0]));
                              });
  return out;
}

std::string Tensor::repr() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor(" + std::string(dtype_name(dtype_)) + ", " + shape_str(shape_) + ", strides " +
         shape_str(strides_) + ")";
}

// ---------------------------------------------------------------- random

namespace {
constexpr std::uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ULL;

// SplitMix64's output for a state (the state advanced by the gamma first).
std::uint64_t split_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double uniform_of(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// Box-Muller: two normals from u1 in (0, 1) and u2 in [0, 1); `first` is the
// one normal() returns, `second` the one it keeps for its next call.
void box_muller(double u1, double u2, double& first, double& second) {
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  second = r * std::sin(theta);
  first = r * std::cos(theta);
}
}  // namespace

std::uint64_t Generator::next_u64() {
  // SplitMix64 (Steele, Lea, Flood 2014): integer-only, so the same on every machine.
  return split_mix(state_ += kSplitMixGamma);
}

double Generator::uniform() { return uniform_of(next_u64()); }

double Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  double first = 0.0;
  box_muller(u1, uniform(), first, spare_);
  has_spare_ = true;
  return first;
}

// The pairs normal() would draw are independent: SplitMix64's j-th output
// from a state s is split_mix(s + j gamma), so pair p (outputs 2p + 1 and
// 2p + 2) is computed wherever it falls among the workers. The one exception
// is a first uniform of 0, which normal() rejects, shifting the stream by
// one draw (1 pair in 2^53): then the whole fill is redone in sequence.
template <class Sink>
void Generator::normals(std::int64_t n, Sink&& sink) {
  const auto one = [&](std::int64_t j) {
    double v = normal();
    sink(j, &v, std::int64_t{1});
  };
  std::int64_t i = 0;
  if (n > 0 && has_spare_) one(i++);
  const std::int64_t pairs = (n - i) / 2;
  const std::uint64_t s0 = state_;
  std::atomic<bool> rejected{false};
  parallel_for(pairs, [&](std::int64_t p0, std::int64_t p1, int) {
    constexpr std::int64_t kBlock = 512;  // pairs handed to the sink at once
    double values[2 * kBlock];
    for (std::int64_t b = p0; b < p1 && !rejected.load(std::memory_order_relaxed); b += kBlock) {
      const std::int64_t count = std::min(kBlock, p1 - b);
      for (std::int64_t k = 0; k < count; ++k) {
        const std::uint64_t s = s0 + 2 * static_cast<std::uint64_t>(b + k) * kSplitMixGamma;
        const double u1 = uniform_of(split_mix(s + kSplitMixGamma));
        if (u1 <= 0.0) {
          rejected = true;
          return;
        }
        box_muller(u1, uniform_of(split_mix(s + 2 * kSplitMixGamma)), values[2 * k], values[2 * k + 1]);
      }
      sink(i + 2 * b, values, 2 * count);
    }
  }, 4096);
  if (rejected) {
    for (std::int64_t j = i; j < n; ++j) one(j);
    return;
  }
  state_ = s0 + 2 * static_cast<std::uint64_t>(pairs) * kSplitMixGamma;
  if (i + 2 * pairs < n) one(n - 1);  // odd: its second value is kept, as normal() keeps it
}

Tensor randn(const Shape& shape, DType dtype, Generator& gen, double stddev) {
  Tensor t = Tensor::empty(shape, dtype);  // contiguous: flat index i is offset i
  void* base = t.storage()->mutable_data();
  gen.normals(t.numel(), [&](std::int64_t i, double* values, std::int64_t count) {
    for (std::int64_t k = 0; k < count; ++k) values[k] *= stddev;
    const auto n = static_cast<std::size_t>(count);
    switch (dtype) {  // the 16-bit dtypes through the bulk narrowing: the same bits as write_to's
      case DType::bfloat16: convert(values, static_cast<BFloat16*>(base) + i, n); break;
      case DType::float16: convert(values, static_cast<Float16*>(base) + i, n); break;
      default:
        for (std::int64_t k = 0; k < count; ++k) write_to(base, dtype, i + k, values[k]);
    }
  });
  return t;
}

Tensor rand_uniform(const Shape& shape, DType dtype, Generator& gen, double lo, double hi) {
  Tensor t = Tensor::empty(shape, dtype);
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) t.set_flat(i, lo + (hi - lo) * gen.uniform());
  return t;
}

}  // namespace headgrad

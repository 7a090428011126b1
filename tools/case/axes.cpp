#include "case/axes.hpp"

#include <cmath>

namespace headgrad::runner {

namespace {

bool is_weight_grad(std::string_view t) { return t == "dwq" || t == "dwk" || t == "dwv"; }
bool is_bias_grad(std::string_view t) { return t == "dbq" || t == "dbk" || t == "dbv"; }
bool is_tap(std::string_view t) { return t == "q_rot" || t == "k_rot"; }
bool reads_keys(std::string_view t) { return t == "dk" || t == "dv" || t == "k" || t == "v" || t == "k_rot"; }

// A dim of n entries packing `heads` blocks: the block width, or n itself when it does not divide.
std::int64_t block_of(std::int64_t n, std::int64_t heads) { return heads > 0 && n % heads == 0 ? n / heads : n; }

// [.., T, d]: b, h when 4-D, else leading dims by position; then the token axis and ch.
std::vector<Axis> token_axes(std::size_t n, std::string position_key) {
  std::vector<Axis> dims;
  if (n < 2) return dims;
  if (n == 4) {
    dims.push_back({AxisRole::batch, "b"});
    dims.push_back({AxisRole::head, "h"});
  } else {
    for (std::size_t i = 0; i + 2 < n; ++i) dims.push_back({AxisRole::leading, "i" + std::to_string(i)});
  }
  dims.push_back({AxisRole::position, std::move(position_key)});
  dims.push_back({AxisRole::channel, "ch"});
  return dims;
}

// ---- QK-norm and cross-attention ----
// dx_kv [B, Tk, D]: b, k (x_kv's tokens), D packing heads like dx. dq_norm,
// dk_norm: [d] under axis head (heads 0: one gain shared by every head, ch),
// [H*d] / [Hkv*d] under axis model (head blocks of d). False: not one of them.
bool qk_norm_cross_axes(std::string_view tensor, const Shape& shape, std::int64_t heads, TensorAxes& a) {
  const std::size_t n = shape.size();
  if (tensor == "dx_kv" && n == 3) {
    a.dims = {{AxisRole::batch, "b"}, {AxisRole::position, "k"}, {AxisRole::heads, "ch", block_of(shape[2], heads)}};
    return true;
  }
  if ((tensor == "dq_norm" || tensor == "dk_norm") && n == 1) {
    if (heads > 0) a.dims = {{AxisRole::heads, "ch", block_of(shape[0], heads)}};
    else a.dims = {{AxisRole::channel, "ch"}};
    return true;
  }
  return false;
}

std::string kv(std::string_view key, std::int64_t value) { return std::string(key) + "=" + std::to_string(value); }

}  // namespace

std::optional<std::size_t> TensorAxes::find(AxisRole role) const {
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (dims[i].role == role || (role == AxisRole::head && dims[i].role == AxisRole::heads)) return i;
  return std::nullopt;
}

std::optional<std::pair<std::size_t, std::int64_t>> TensorAxes::head_dim() const {
  const auto i = find(AxisRole::head);
  if (!i) return std::nullopt;
  return std::pair{*i, dims[*i].role == AxisRole::heads ? dims[*i].block : std::int64_t{1}};
}

TensorAxes axes_of(Level level, std::string_view tensor, const Shape& shape, std::int64_t heads) {
  const std::size_t n = shape.size();
  TensorAxes a;
  if (tensor == "dsinks" && n == 1) {  // [H]: one sink logit per query head, at both levels
    a.dims = {{AxisRole::head, "head"}};
    return a;
  }
  if (level == Level::mha && !is_tap(tensor)) {
    if ((tensor == "out" || tensor == "dx") && n == 3)
      a.dims = {{AxisRole::batch, "b"}, {AxisRole::position, "t"}, {AxisRole::heads, "ch", block_of(shape[2], heads)}};
    else if (is_weight_grad(tensor) && n == 2)
      a.dims = {{AxisRole::heads, "row", block_of(shape[0], heads)}, {AxisRole::features, "in"}};
    else if (tensor == "dwo" && n == 2)
      a.dims = {{AxisRole::features, "out"}, {AxisRole::heads, "col", block_of(shape[1], heads)}};
    else if (is_bias_grad(tensor) && n == 1)  // as its weight's rows
      a.dims = {{AxisRole::heads, "row", block_of(shape[0], heads)}};
    else if (tensor == "dbo" && n == 1)  // output features: no head owns one
      a.dims = {{AxisRole::features, "out"}};
    else
      qk_norm_cross_axes(tensor, shape, heads, a);
    return a;
  }
  a.dims = token_axes(n, level == Level::core ? (reads_keys(tensor) ? "k" : "q") : "t");
  return a;
}

std::int64_t head_blocks(const CaseSpec& c, std::string_view tensor) {
  if (tensor == "dq_norm" || tensor == "dk_norm") {  // per head under axis model; one shared [d] gain under axis head
    if (c.qk_norm.axis != QkNormAxis::model) return 0;
    return tensor == "dk_norm" ? c.dims.kv_heads() : c.dims.H;
  }
  const bool kv_blocks = tensor == "dwk" || tensor == "dwv" || tensor == "dbk" || tensor == "dbv" || tensor == "k_rot";
  return kv_blocks ? c.dims.kv_heads() : c.dims.H;
}

std::string describe_index(Level level, std::string_view tensor, const Shape& shape,
                           std::span<const std::int64_t> index, std::int64_t heads) {
  const TensorAxes axes = axes_of(level, tensor, shape, heads);
  if (index.size() != shape.size() || axes.dims.size() != index.size() || index.empty()) return shape_str(index);
  std::string s;
  for (std::size_t i = 0; i < index.size(); ++i) {
    const Axis& ax = axes.dims[i];
    if (!s.empty()) s += ", ";
    if (ax.role == AxisRole::heads) s += kv("head", index[i] / ax.block) + ", " + kv(ax.key, index[i] % ax.block);
    else s += kv(ax.key, index[i]);
  }
  return s;
}

std::optional<ElementRef> first_non_finite(const Tensor& t, Level level, std::string_view name,
                                           std::int64_t heads) {
  if (!t.defined() || t.dtype() == DType::boolean) return std::nullopt;
  const std::vector<double> v = t.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) continue;
    ElementRef e;
    e.index = unravel_index(static_cast<std::int64_t>(i), t.shape());
    e.where = describe_index(level, name, t.shape(), e.index, heads);
    e.lhs = v[i];
    return e;
  }
  return std::nullopt;
}

}  // namespace headgrad::runner

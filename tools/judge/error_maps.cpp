#include "judge/error_maps.hpp"

#include "case/axes.hpp"

#include <algorithm>
#include <cmath>

namespace headgrad::runner {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// |a - b| row-major; NaN where either side is not finite.
std::vector<double> abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  std::vector<double> v(va.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = (std::isfinite(va[i]) && std::isfinite(vb[i])) ? std::abs(va[i] - vb[i]) : NAN;
  return v;
}

// A full-resolution map [rows, cols] downsampled to at most kMaxMapRows x kMaxMapCols cells.
ErrorMap downsample(std::string title, std::int64_t rows, std::int64_t cols, const std::vector<double>& v,
                    std::int64_t row_block, std::int64_t col_block, bool position_rows) {
  ErrorMap m{std::move(title), rows, cols, ceil_div(rows, kMaxMapRows), ceil_div(cols, kMaxMapCols),
             0, 0, {}, row_block, col_block, position_rows};
  m.cell_rows = ceil_div(rows, m.row_step);
  m.cell_cols = ceil_div(cols, m.col_step);
  m.cells.assign(static_cast<std::size_t>(m.cell_rows * m.cell_cols), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      double& cell = m.cells[static_cast<std::size_t>((i / m.row_step) * m.cell_cols + j / m.col_step)];
      const double e = v[static_cast<std::size_t>(i * cols + j)];
      if (std::isnan(e) || std::isnan(cell)) cell = NAN;
      else cell = std::max(cell, e);
    }
  return m;
}

// The maps of one tensor, cut by what its dims mean (case/axes.hpp).
void cut(TensorErrorMaps& out, const CaseSpec& spec, const std::string& name, const Shape& shape,
         const std::vector<double>& diff) {
  const TensorAxes axes = axes_of(spec.level, name, shape, head_blocks(spec, name));
  const auto& dims = axes.dims;
  auto role = [&](std::size_t i) { return i < dims.size() ? dims[i].role : AxisRole::leading; };
  if (dims.size() == 3 && role(0) == AxisRole::batch && role(1) == AxisRole::position &&
      role(2) == AxisRole::heads) {  // out, dx [B, T, D]: D packs the heads
    const std::int64_t B = shape[0], T = shape[1], D = shape[2], block = dims[2].block;
    const std::int64_t d = D / block > 1 ? block : 0;  // one head: no head lines
    out.batches = B;
    out.axes = std::string(dims[1].key == "k" ? "rows: x_kv's tokens (keys)" : "rows: positions t") +
               "; columns: heads × channels (d = " + std::to_string(block) + ")";
    for (std::int64_t b = 0; b < std::min(B, kMaxMapBatch); ++b) {
      const std::vector<double> slice(diff.begin() + b * T * D, diff.begin() + (b + 1) * T * D);
      out.maps.push_back(downsample("b=" + std::to_string(b), T, D, slice, 0, d, true));
    }
  } else if (dims.size() == 2 && (role(0) == AxisRole::heads || role(1) == AxisRole::heads)) {  // weight gradients
    const bool cols = role(1) == AxisRole::heads;  // dwo [D, H*d]; else dwq [H*d, D], dwk, dwv [Hkv*d, D]
    const std::int64_t R = shape[0], C = shape[1], block = dims[cols ? 1 : 0].block;
    const std::int64_t d = (cols ? C : R) / block > 1 ? block : 0;
    out.axes = cols ? "rows: output features; columns: input features, head h owns columns [h·d, (h+1)·d)"
                    : "rows: output features, head h owns rows [h·d, (h+1)·d); columns: input features";
    out.maps.push_back(downsample("", R, C, diff, cols ? 0 : d, cols ? d : 0, false));
  } else if (dims.size() == 1 && (role(0) == AxisRole::heads || role(0) == AxisRole::features)) {  // biases: one row
    const bool heads = role(0) == AxisRole::heads;  // dbq [H*d], dbk, dbv [Hkv*d]; else dbo [D]
    const std::int64_t n = shape[0], block = dims[0].block;
    const std::int64_t d = heads && n / block > 1 ? block : 0;
    out.axes = heads ? "one row: output features, head h owns entries [h·d, (h+1)·d)" : "one row: output features";
    out.maps.push_back(downsample("", 1, n, diff, 0, d, false));
  } else if (dims.size() == 1 && role(0) == AxisRole::head) {  // dsinks [H]
    out.axes = "one row: query heads (one sink logit each)";
    out.maps.push_back(downsample("", 1, shape[0], diff, 0, 0, false));
  } else if (dims.size() == 4 && role(0) == AxisRole::batch && role(1) == AxisRole::head &&
             role(2) == AxisRole::position) {  // [B, H, T, c]
    const std::int64_t B = shape[0], H = shape[1], T = shape[2], c = shape[3];
    const std::string& pos = dims[2].key;
    out.batches = B;
    out.axes = std::string("rows: ") + (pos == "k" ? "key positions" : pos == "q" ? "query positions" : "positions t") +
               "; columns: heads side by side, channels within each";
    for (std::int64_t b = 0; b < std::min(B, kMaxMapBatch); ++b) {
      std::vector<double> v(static_cast<std::size_t>(T * H * c));
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t ch = 0; ch < c; ++ch)
            v[t * H * c + h * c + ch] = diff[((b * H + h) * T + t) * c + ch];
      out.maps.push_back(downsample("b=" + std::to_string(b), T, H * c, v, 0, H > 1 ? c : 0, true));
    }
  } else if (dims.size() == 1 && role(0) == AxisRole::channel) {  // dq_norm, dk_norm under axis head: one [d] gain
    out.axes = "one row: the channels of the gain every head shares";
    out.maps.push_back(downsample("", 1, shape[0], diff, 0, 0, false));
  } else if (!shape.empty()) {  // anything else: all leading dims as rows
    const std::int64_t C = shape.back();
    const std::int64_t R = C > 0 ? static_cast<std::int64_t>(diff.size()) / C : 0;
    out.axes = "rows: leading dims flattened; columns: last dim";
    out.maps.push_back(downsample("", R, C, diff, 0, 0, false));
  }
}

}  // namespace

std::vector<TensorErrorMaps> error_maps(const CaseSpec& spec, const std::vector<TensorComparison>& tensors,
                                        const TensorSet& lhs, const TensorSet& rhs) {
  std::vector<TensorErrorMaps> out;
  for (const auto& t : tensors) {
    if (!t.problem.empty()) continue;
    const Tensor* a = find_tensor(lhs, t.name);
    const Tensor* b = find_tensor(rhs, t.name);
    if (!a || !b || !a->defined() || !b->defined() || a->shape() != b->shape() || a->numel() == 0) continue;
    const std::vector<double> diff = abs_diff(*a, *b);
    TensorErrorMaps m;
    m.tensor = t.name;
    m.shape = a->shape();
    m.allclose = t.allclose;
    for (double x : diff) {
      if (std::isnan(x)) m.non_finite = true;
      else m.vmax = std::max(m.vmax, x);
    }
    cut(m, spec, t.name, m.shape, diff);
    if (!m.maps.empty()) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace headgrad::runner

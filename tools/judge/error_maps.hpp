// |lhs - rhs| of each compared tensor of a case, cut into 2D maps and
// downsampled: the data of the HTML report's heatmaps, small enough to keep
// for every failing case once its tensors are gone.
//
//   std::vector<TensorErrorMaps> maps = error_maps(result.spec, result.tensors, result.lhs, result.rhs);
//
// Cuts (d = D / H): mha out, dx [B, T, D]: one map per batch item, rows
// positions, columns heads x channels; dW [D, D]: one map, head blocks as rows
// (dwq, dwk, dwv) or columns (dwo); core [B, H, T, c]: one map per batch item,
// rows positions, heads side by side. At most kMaxMapBatch batch items and
// kMaxMapRows x kMaxMapCols cells per map (a cell: the max over its block).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "judge/compare.hpp"
#include "case/inputs.hpp"
#include "case/suite.hpp"

namespace headgrad::runner {

constexpr std::int64_t kMaxMapRows = 48;  // cells, after downsampling
constexpr std::int64_t kMaxMapCols = 72;
constexpr std::int64_t kMaxMapBatch = 4;  // batch items drawn per tensor

struct ErrorMap {
  std::string title;                       // "b=0"
  std::int64_t rows = 0, cols = 0;         // elements, before downsampling
  std::int64_t row_step = 1, col_step = 1; // elements per cell, each way
  std::int64_t cell_rows = 0, cell_cols = 0;
  std::vector<double> cells;               // [cell_rows, cell_cols]: max |a - b|; NaN where a side is not finite
  std::int64_t row_block = 0;              // head block height in elements (0: none)
  std::int64_t col_block = 0;              // head block width in elements (0: none)
  bool position_rows = false;              // the rows are positions t0, t1, ...
};

struct TensorErrorMaps {
  std::string tensor;
  Shape shape;
  bool allclose = true;
  double vmax = 0;          // max |a - b| over the finite elements
  bool non_finite = false;  // a side is NaN or Inf somewhere
  std::string axes;         // what rows and columns are, in words (plain text: the HTML escapes it)
  std::int64_t batches = 0; // batch items of the tensor (maps show kMaxMapBatch at most)
  std::vector<ErrorMap> maps;
};

// One entry per compared tensor that both sides produced with one shape.
std::vector<TensorErrorMaps> error_maps(const CaseSpec& spec, const std::vector<TensorComparison>& tensors,
                                        const TensorSet& lhs, const TensorSet& rhs);

}  // namespace headgrad::runner

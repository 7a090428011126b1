// headgrad bench, its configuration: a bench YAML file and flags (bench.hpp).
#include <set>
#include <sstream>

#include "case/budget.hpp"
#include <yaml-cpp/yaml.h>

#include "bench.hpp"

namespace headgrad::bench {

std::vector<std::string> default_plugins() { return {"batched", "per_head", "fused_sdpa"}; }

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::float32;
  if (name == "float64") return DType::float64;
  if (name == "bfloat16") return DType::bfloat16;
  if (name == "float16") return DType::float16;
  throw BenchConfigError("dtype '" + name + "' is not float32, float64, bfloat16 or float16");
}

void validate(const BenchConfig& c) {
  if (c.level != "mha" && c.level != "core")
    throw BenchConfigError("level '" + c.level + "' is not mha or core");
  if (c.plugins.empty()) throw BenchConfigError("no plugin to run");
  if (c.shapes.empty()) throw BenchConfigError("no shape to run (give a SUITE.yaml or --shape B,T,D,H)");
  if (c.dtypes.empty()) throw BenchConfigError("no dtype to run");
  if (c.threads.empty()) throw BenchConfigError("no thread count to run");
  for (int t : c.threads)
    if (t < 1) throw BenchConfigError("threads must be >= 1, got " + std::to_string(t));
  if (c.repeats < 1) throw BenchConfigError("repeats must be >= 1, got " + std::to_string(c.repeats));
  if (c.warmup < 0) throw BenchConfigError("warmup must be >= 0, got " + std::to_string(c.warmup));
  if (c.gemm_size < 1)
    throw BenchConfigError("gemm_size must be >= 1, got " + std::to_string(c.gemm_size));
  for (const auto& s : c.shapes) {
    if (s.B < 1 || s.T < 1 || s.D < 1 || s.H < 1)
      throw BenchConfigError("shape " + s.str() + ": every size must be >= 1");
    if (s.D % s.H != 0)
      throw BenchConfigError("shape " + s.str() + ": D must be divisible by H");
    if (s.Hkv < 0 || s.Hkv > s.H || (s.Hkv > 0 && s.H % s.Hkv != 0))
      throw BenchConfigError("shape " + s.str() + ": Hkv must divide H (query head h reads kv head h / (H / Hkv))");
    // Refused before anything is allocated; without score buffers, so a shape
    // only a fused plugin can hold still runs (the others then report an error row).
    const runner::AttentionDims dims{.mha = c.level == "mha", .B = double(s.B), .H = double(s.H),
                                     .Tq = double(s.T), .Tk = double(s.T), .d = double(s.D / s.H),
                                     .D = double(s.D), .Hkv = double(s.kv_heads()), .score_buffers = false};
    const runner::MemoryBudget budget = runner::memory_budget(std::nullopt);
    for (DType dtype : c.dtypes)
      if (const double need = runner::attention_bytes(dims, double(dtype_size(dtype))); need > budget.bytes)
        throw BenchConfigError("shape " + s.str() + " in " + std::string(dtype_name(dtype)) + " needs about " +
                               runner::format_bytes(need) + " for its inputs, outputs and gradients alone, more "
                               "than the " + runner::format_bytes(budget.bytes) + " of " + budget.source);
  }
}

std::string BenchShape::str() const {
  std::string s = "(";
  for (const std::int64_t v : {B, T, D, H}) {
    if (s.size() > 1) s += ',';
    s += std::to_string(v);
  }
  if (Hkv > 0 && Hkv != H) s += "," + std::to_string(Hkv);
  return s + ")";
}

BenchShape parse_shape(const std::string& text) {
  std::string t;
  for (char ch : text)
    if (ch != '(' && ch != ')' && ch != ' ') t += ch;
  BenchShape s;
  std::int64_t* dst[] = {&s.B, &s.T, &s.D, &s.H, &s.Hkv};
  std::stringstream ss(t);
  std::string part;
  int i = 0;
  while (std::getline(ss, part, ',')) {
    if (i >= 5) throw BenchConfigError("shape '" + text + "' is not B,T,D,H or B,T,D,H,Hkv (four or five integers)");
    try {
      std::size_t used = 0;
      *dst[i] = std::stoll(part, &used);
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw BenchConfigError("shape '" + text + "': '" + part + "' is not an integer");
    }
    ++i;
  }
  if (i < 4)
    throw BenchConfigError("shape '" + text + "' is not B,T,D,H or B,T,D,H,Hkv (four or five integers)");
  return s;
}

WindowSpec parse_window(const std::string& text) {
  if (text == "none") return {};
  const std::size_t comma = text.find(',');
  const auto bound = [&](const std::string& part, const char* which) {
    try {
      std::size_t used = 0;
      const long long v = std::stoll(part, &used);
      if (used != part.size() || v < 0) throw std::invalid_argument(part);
      return static_cast<std::int64_t>(v);
    } catch (const std::exception&) {
      throw BenchConfigError("--window '" + text + "': the " + which + " bound '" + part +
                             "' is not an integer >= 0 (L or L,R: query i sees keys i - L .. i + R; or none)");
    }
  };
  WindowSpec w;
  w.left = bound(text.substr(0, comma), "left");
  w.right = comma == std::string::npos ? 0 : bound(text.substr(comma + 1), "right");
  return w;
}

std::string window_str(const WindowSpec& w) {
  if (!w.enabled()) return "none";
  std::ostringstream text;
  const auto side = [&](const std::optional<std::int64_t>& b) {
    if (b) text << *b;
    else text << '-';
  };
  side(w.left);
  text << ',';
  side(w.right);
  return text.str();
}

WindowSpec row_window(const nlohmann::json& row) {
  WindowSpec w;
  if (!row.contains("window")) return w;
  const auto bound = [](const nlohmann::json& b) {
    return b.is_null() ? std::nullopt : std::optional(b.get<std::int64_t>());
  };
  w.left = bound(row["window"]["left"]);
  w.right = bound(row["window"]["right"]);
  return w;
}

BenchConfig load_bench_config(const std::filesystem::path& file) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    throw BenchConfigError(file.string() + ": " + e.what());
  }
  if (!root.IsMap()) throw BenchConfigError(file.string() + ": expected a mapping of bench keys");
  const std::set<std::string> known{"bench", "description", "level", "causal", "plugins",
                                    "shapes", "dtypes", "threads", "repeats", "warmup",
                                    "gemm_size", "seed"};
  BenchConfig c;
  auto where = [&](const YAML::Node& n) {
    return file.string() + ":" + std::to_string(n.Mark().line + 1) + ":" +
           std::to_string(n.Mark().column + 1) + ": ";
  };
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (!known.count(key))
        throw BenchConfigError(where(kv.first) + "unknown key '" + key + "'");
      auto list = [&](auto fn) {
        if (!v.IsSequence()) throw BenchConfigError(where(v) + "'" + key + "' must be a list");
        for (const auto& item : v) fn(item);
      };
      if (key == "level") c.level = v.as<std::string>();
      else if (key == "causal") c.causal = v.as<bool>();
      else if (key == "repeats") c.repeats = v.as<int>();
      else if (key == "warmup") c.warmup = v.as<int>();
      else if (key == "gemm_size") c.gemm_size = v.as<std::int64_t>();
      else if (key == "seed") c.seed = v.as<std::uint64_t>();
      else if (key == "plugins") {
        c.plugins.clear();
        list([&](const YAML::Node& n) { c.plugins.push_back(n.as<std::string>()); });
      } else if (key == "dtypes") {
        c.dtypes.clear();
        list([&](const YAML::Node& n) {
          try {
            c.dtypes.push_back(parse_dtype(n.as<std::string>()));
          } catch (const BenchConfigError& e) {
            throw BenchConfigError(where(n) + e.what());
          }
        });
      } else if (key == "threads") {
        c.threads.clear();
        list([&](const YAML::Node& n) { c.threads.push_back(n.as<int>()); });
      } else if (key == "shapes") {
        list([&](const YAML::Node& n) {
          if (!n.IsMap()) throw BenchConfigError(where(n) + "a shape is {B: .., T: .., D: .., H: ..}");
          BenchShape s;
          for (const auto& dim : n) {
            const std::string k = dim.first.as<std::string>();
            const auto value = dim.second.as<std::int64_t>();
            if (k == "B") s.B = value;
            else if (k == "T") s.T = value;
            else if (k == "D") s.D = value;
            else if (k == "H") s.H = value;
            else if (k == "Hkv") s.Hkv = value;
            else throw BenchConfigError(where(dim.first) + "unknown shape key '" + k + "' (B, T, D, H, Hkv)");
          }
          if (s.B < 1 || s.T < 1 || s.D < 1 || s.H < 1 || s.D % s.H != 0)
            throw BenchConfigError(where(n) + "shape " + s.str() +
                                   " needs B, T, D, H >= 1 with D divisible by H");
          c.shapes.push_back(s);
        });
      }
    }
  } catch (const YAML::Exception& e) {
    throw BenchConfigError(file.string() + ": " + e.what());
  }
  if (c.plugins.empty()) c.plugins = default_plugins();
  return c;
}

}  // namespace headgrad::bench

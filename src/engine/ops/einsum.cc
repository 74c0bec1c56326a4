// Einsum by index loops: every assignment of the equation's labels is visited once, the
// output labels outermost, and the product of the inputs' elements is summed over the
// labels the output omits. Correct for every equation ONNX allows (products, batched
// products, transposes, reductions, traces and diagonals through repeated labels,
// broadcast ellipses); its cost is the product of all label extents, so large
// contractions are slower than a MatMul would be.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

// Labels of ellipsis dimensions: 256, 257, ... (outermost first), past every letter.
constexpr int kEllipsisBase = 256;

struct Term {
  std::vector<int> labels;  // letters as their character code, ellipsis dims from kEllipsisBase
  bool has_ellipsis = false;
};

// Parses one term ("ij", "...ij", "b...") into its letters; the ellipsis is expanded
// once its rank is known.
StatusOr<Term> ParseTerm(const std::string& text) {
  Term t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ') continue;
    if (c == '.') {
      if (t.has_ellipsis || text.compare(i, 3, "...") != 0)
        return InvalidArgument("malformed ellipsis in '" + text + "'");
      t.has_ellipsis = true;
      t.labels.push_back(-1);  // placeholder
      i += 2;
      continue;
    }
    if (!std::isalpha(static_cast<unsigned char>(c)))
      return InvalidArgument(std::string("label '") + c + "' is not a letter");
    t.labels.push_back(c);
  }
  return t;
}

// Replaces the placeholder by `n` ellipsis labels, aligned to the right of `max_n`.
std::vector<int> Expand(const Term& t, int64_t n, int64_t max_n) {
  std::vector<int> out;
  for (int l : t.labels) {
    if (l != -1) {
      out.push_back(l);
      continue;
    }
    for (int64_t k = 0; k < n; ++k) out.push_back(kEllipsisBase + static_cast<int>(max_n - n + k));
  }
  return out;
}

StatusOr<std::unique_ptr<Kernel>> PrepareEinsum(PrepareContext& ctx) {
  const std::string eq = ctx.node().GetString("equation", "");
  if (ctx.num_inputs() == 0) return ctx.Error("needs at least one input");
  if (eq.empty()) return ctx.Error("needs an equation");
  const DataType dtype = ctx.in_dtypes[0];
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i) || ctx.in_dtypes[i] != dtype)
      return ctx.Error("all inputs must be present and of one type");
  }
  Status ok = DispatchNumeric(dtype, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    auto t = ParseTerm(
        lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!t.ok()) return ctx.Error(t.status().message());
    terms.push_back(*t);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != ctx.num_inputs())
    return ctx.Error("the equation has " + std::to_string(terms.size()) + " terms for " +
                     std::to_string(ctx.num_inputs()) + " inputs");
  // Ellipsis ranks per input, and the broadcast ellipsis rank.
  std::vector<int64_t> ell(terms.size(), 0);
  int64_t max_ell = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const int64_t letters =
        static_cast<int64_t>(terms[i].labels.size()) - (terms[i].has_ellipsis ? 1 : 0);
    const int64_t rank = static_cast<int64_t>(ctx.in_shapes[i].size());
    if (terms[i].has_ellipsis ? rank < letters : rank != letters)
      return ctx.Error("term " + std::to_string(i) + " does not match input rank " +
                       std::to_string(rank));
    ell[i] = terms[i].has_ellipsis ? rank - letters : 0;
    max_ell = std::max(max_ell, ell[i]);
  }
  std::vector<std::vector<int>> in_labels;
  std::map<int, int64_t> extent;  // per label
  std::map<int, int> count;       // occurrences over all inputs
  for (size_t i = 0; i < terms.size(); ++i) {
    in_labels.push_back(Expand(terms[i], ell[i], max_ell));
    const Shape& s = ctx.in_shapes[i];
    for (size_t a = 0; a < s.size(); ++a) {
      const int l = in_labels[i][a];
      ++count[l];
      auto it = extent.find(l);
      if (it == extent.end() || it->second == 1) {
        extent[l] = s[a];
      } else if (s[a] != it->second && s[a] != 1) {
        return ctx.Error("label extents disagree: " + std::to_string(s[a]) + " and " +
                         std::to_string(it->second));
      }
    }
  }
  std::vector<int> out_labels;
  if (arrow == std::string::npos) {
    // Implicit output: the ellipsis, then the letters that occur once, in order.
    for (int64_t k = 0; k < max_ell; ++k) out_labels.push_back(kEllipsisBase + static_cast<int>(k));
    for (const auto& [l, n] : count) {
      if (l < kEllipsisBase && n == 1) out_labels.push_back(l);
    }
  } else {
    auto t = ParseTerm(eq.substr(arrow + 2));
    if (!t.ok()) return ctx.Error(t.status().message());
    out_labels = Expand(*t, max_ell, max_ell);
    for (size_t a = 0; a < out_labels.size(); ++a) {
      if (!extent.count(out_labels[a]))
        return ctx.Error("output label does not occur in any input");
      if (std::count(out_labels.begin(), out_labels.end(), out_labels[a]) > 1)
        return ctx.Error("output label repeats");
    }
  }
  // Loop order: output labels, then the summed ones. Each label gets a slot.
  std::vector<int> loop = out_labels;
  for (const auto& [l, n] : extent) {
    if (std::find(loop.begin(), loop.end(), l) == loop.end()) loop.push_back(l);
  }
  const size_t n_out = out_labels.size();
  std::vector<int64_t> sizes;
  for (int l : loop) sizes.push_back(extent[l]);
  Shape out_shape(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(n_out));
  // Per input, the stride each loop slot moves it by (0 where the label is absent or
  // broadcast; repeated labels add their strides: a diagonal).
  std::vector<std::vector<int64_t>> strides(terms.size(), std::vector<int64_t>(loop.size(), 0));
  for (size_t i = 0; i < terms.size(); ++i) {
    const Shape& s = ctx.in_shapes[i];
    int64_t stride = 1;
    for (size_t a = s.size(); a-- > 0;) {
      const size_t slot =
          static_cast<size_t>(std::find(loop.begin(), loop.end(), in_labels[i][a]) - loop.begin());
      if (s[a] != 1) strides[i][slot] += stride;
      stride *= s[a];
    }
  }
  ctx.out_shapes[0] = out_shape;
  ctx.out_dtypes[0] = dtype;
  const int64_t out_count = Product(out_shape);
  int64_t inner_count = 1;
  for (size_t k = n_out; k < sizes.size(); ++k) inner_count *= sizes[k];
  return MakeFn([=](const RunContext& rc) -> Status {
    return DispatchNumeric(dtype, [&]<typename T>() {
      const size_t n_in = rc.inputs.size();
      std::vector<const T*> src(n_in);
      for (size_t i = 0; i < n_in; ++i) src[i] = static_cast<const T*>(rc.inputs[i]->data());
      T* dst = static_cast<T*>(rc.outputs[0]->mutable_data());
      std::vector<int64_t> idx(sizes.size(), 0), base(n_in, 0), off(n_in, 0);
      for (int64_t o = 0; o < out_count; ++o) {
        // Offsets of the output slots' position.
        for (size_t i = 0; i < n_in; ++i) {
          base[i] = 0;
          for (size_t k = 0; k < n_out; ++k) base[i] += idx[k] * strides[i][k];
        }
        std::fill(idx.begin() + static_cast<std::ptrdiff_t>(n_out), idx.end(), 0);
        off = base;
        T sum = T(0);
        for (int64_t c = 0; c < inner_count; ++c) {
          T prod = T(1);
          for (size_t i = 0; i < n_in; ++i) prod *= src[i][off[i]];
          sum += prod;
          // Next assignment of the summed labels (odometer, last slot fastest).
          for (size_t k = sizes.size(); k-- > n_out;) {
            for (size_t i = 0; i < n_in; ++i) off[i] += strides[i][k];
            if (++idx[k] < sizes[k]) break;
            for (size_t i = 0; i < n_in; ++i) off[i] -= strides[i][k] * sizes[k];
            idx[k] = 0;
          }
        }
        dst[o] = sum;
        for (size_t k = n_out; k-- > 0;) {
          if (++idx[k] < sizes[k]) break;
          idx[k] = 0;
        }
      }
    });
  });
}

}  // namespace

void RegisterEinsumOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "Einsum", {"equation"}, nullptr, PrepareEinsum});
}

}  // namespace shoal::engine::internal

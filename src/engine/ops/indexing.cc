// Indexing operators, computed by the engine: Slice, Gather, Pad, Resize (nearest,
// linear, cubic). Index tables are built once per plan; a run only moves bytes. A Resize
// whose sizes or scales are known only at run time is prepared at run time instead.
// Resize reads its source in any layout: nearest upsampling by whole factors runs on
// oneDNN's resampling primitive in that layout (a convolution's channels-last output stays
// channels-last, and so does the upsampled value an FPN adds into the next convolution's
// sum post-op, where a plain one would force that convolution onto a slow plain-layout
// kernel); every other form reorders such a source to plain and runs the engine's loops.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "engine/internal/broadcast.h"
#include "engine/internal/op_util.h"
#include "engine/internal/resize.h"
#include "engine/plan.h"

namespace shoal::engine::internal {
namespace {

using dnnl::memory;

std::vector<int64_t> RowMajorStrides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

StatusOr<std::vector<int64_t>> KnownInts(PrepareContext& ctx, size_t i, const char* what) {
  if (!ctx.in_data[i])
    return ctx.Error(std::string(what) + " must be a constant or computed from shapes");
  auto v = ReadInts(*ctx.in_data[i]);
  if (!v.ok()) return ctx.Error(std::string(what) + ": " + v.status().message());
  return *v;
}

StatusOr<std::unique_ptr<Kernel>> PrepareSlice(PrepareContext& ctx) {
  if (ctx.num_inputs() < 3 || !ctx.has_input(0)) return ctx.Error("needs data, starts and ends");
  const Shape& x = ctx.in_shapes[0];
  const int64_t r = static_cast<int64_t>(x.size());
  ASSIGN_OR_RETURN(auto starts, KnownInts(ctx, 1, "starts"));
  ASSIGN_OR_RETURN(auto ends, KnownInts(ctx, 2, "ends"));
  std::vector<int64_t> axes, steps;
  if (ctx.has_input(3)) {
    ASSIGN_OR_RETURN(axes, KnownInts(ctx, 3, "axes"));
  } else
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (ctx.has_input(4)) {
    ASSIGN_OR_RETURN(steps, KnownInts(ctx, 4, "steps"));
  } else
    steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size()) {
    return ctx.Error("starts, ends, axes and steps must have the same length");
  }
  Shape out = x;
  std::vector<int64_t> begin(x.size(), 0), step(x.size(), 1);
  std::vector<char> seen(x.size(), 0);
  for (size_t i = 0; i < starts.size(); ++i) {
    auto ax = NormalizeAxis(axes[i], r);
    if (!ax.ok() || r == 0)
      return ctx.Error("axis " + std::to_string(axes[i]) + " is out of range");
    if (seen[*ax]++) return ctx.Error("an axis appears twice");
    const int64_t d = x[*ax], s = steps[i];
    if (s == 0) return ctx.Error("steps must be non-zero");
    int64_t b = starts[i], e = ends[i];
    if (b < 0) b += d;
    if (e < 0) e += d;
    if (s > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      out[*ax] = e > b ? (e - b + s - 1) / s : 0;
    } else if (d == 0) {
      b = e = 0;  // nothing to walk backwards over (and clamp needs low <= high)
      out[*ax] = 0;
    } else {
      b = std::clamp<int64_t>(b, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      out[*ax] = b > e ? (b - e + (-s) - 1) / (-s) : 0;
    }
    begin[*ax] = b;
    step[*ax] = s;
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const auto strides = RowMajorStrides(x);
  int64_t base = 0;
  std::vector<int64_t> in_strides(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (out[i] > 0) base += begin[i] * strides[i];
    in_strides[i] = strides[i] * step[i];
  }
  const DataType t = ctx.in_dtypes[0];
  return MakeFn([t, base, in_strides](const RunContext& rc) {
    return DispatchBySize(t, [&]<typename T>() {
      const T* in = rc.inputs[0]->values<T>().data() + base;
      T* o = rc.outputs[0]->mutable_values<T>().data();
      std::array<std::vector<int64_t>, 1> st{in_strides};
      BroadcastLoop<1>(rc.outputs[0]->shape(), st,
                       [&](int64_t i, const std::array<int64_t, 1>& off) { o[i] = in[off[0]]; });
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareGather(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs data and indices");
  if (ctx.in_dtypes[1] != DataType::kInt64 && ctx.in_dtypes[1] != DataType::kInt32) {
    return ctx.Error("indices must be INT32 or INT64");
  }
  const Shape& x = ctx.in_shapes[0];
  const Shape& idx = ctx.in_shapes[1];
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(x.size()));
  if (!axis.ok() || x.empty()) return ctx.Error("axis is out of range for " + ShapeToString(x));
  Shape out(x.begin(), x.begin() + *axis);
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), x.begin() + *axis + 1, x.end());
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const int64_t outer = Product(x, 0, *axis), dim = x[*axis];
  const size_t inner_bytes =
      static_cast<size_t>(Product(x, *axis + 1)) * DataTypeSize(ctx.in_dtypes[0]);
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([outer, dim, inner_bytes, who](const RunContext& rc) -> Status {
    auto indices = ReadInts(*rc.inputs[1]);
    if (!indices.ok()) return indices.status();
    for (int64_t& i : *indices) {
      if (i < -dim || i >= dim) {
        return InvalidArgument(who + ": index " + std::to_string(i) +
                               " is out of range for a dimension of " + std::to_string(dim));
      }
      if (i < 0) i += dim;
    }
    const char* src = static_cast<const char*>(rc.inputs[0]->data());
    char* o = static_cast<char*>(rc.outputs[0]->mutable_data());
    const size_t n = indices->size();
    for (int64_t r = 0; r < outer; ++r) {
      for (size_t j = 0; j < n; ++j) {
        std::memcpy(o + (r * n + j) * inner_bytes, src + (r * dim + (*indices)[j]) * inner_bytes,
                    inner_bytes);
      }
    }
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<Kernel>> PreparePad(PrepareContext& ctx) {
  if (ctx.num_inputs() < 2 || !ctx.has_input(0)) return ctx.Error("needs data and pads");
  const std::string mode = ctx.node().GetString("mode", "constant");
  const Shape& x = ctx.in_shapes[0];
  const size_t r = x.size();
  ASSIGN_OR_RETURN(auto pads, KnownInts(ctx, 1, "pads"));
  if (ctx.num_inputs() > 3 && ctx.has_input(3)) {
    // Opset 18's `axes`: pads speaks of these axes only (starts, then ends); the others
    // are not padded.
    ASSIGN_OR_RETURN(auto axes, KnownInts(ctx, 3, "axes"));
    if (pads.size() != 2 * axes.size())
      return ctx.Error("pads must have 2 * " + std::to_string(axes.size()) +
                       " entries for the axes given");
    std::vector<int64_t> full(2 * r, 0);
    std::vector<char> seen(r, 0);
    for (size_t k = 0; k < axes.size(); ++k) {
      auto a = NormalizeAxis(axes[k], static_cast<int64_t>(r));
      if (!a.ok()) return ctx.Error(a.status().message());
      if (seen[static_cast<size_t>(*a)]++) return ctx.Error("axes repeat");
      full[static_cast<size_t>(*a)] = pads[k];
      full[static_cast<size_t>(*a) + r] = pads[axes.size() + k];
    }
    pads = std::move(full);
  }
  if (pads.size() != 2 * r) return ctx.Error("pads must have 2 * rank entries");
  Tensor value = Tensor::Allocate(ctx.in_dtypes[0], {});
  if (ctx.has_input(2)) {
    if (!ctx.in_data[2]) return ctx.Error("constant_value must be a constant");
    if (ctx.in_data[2]->dtype() != ctx.in_dtypes[0] || ctx.in_data[2]->element_count() != 1) {
      return ctx.Error("constant_value must be one value of the data's type");
    }
    value = *ctx.in_data[2];
  }
  Shape out(r);
  // Per axis: output coordinate -> input coordinate, or -1 for the constant.
  std::vector<std::vector<int64_t>> maps(r);
  for (size_t i = 0; i < r; ++i) {
    out[i] = x[i] + pads[i] + pads[i + r];
    if (out[i] < 0) return ctx.Error("pads remove more than the whole axis");
    if (mode != "constant" && x[i] == 0 && out[i] > 0)
      return ctx.Error(mode + " padding of an empty axis");
    if (mode == "reflect" && (pads[i] >= x[i] || pads[i + r] >= x[i]) &&
        (pads[i] > 0 || pads[i + r] > 0)) {
      return ctx.Error("reflect pads must be smaller than the axis");
    }
    for (int64_t o = 0; o < out[i]; ++o) {
      int64_t j = o - pads[i];
      if (j < 0 || j >= x[i]) {
        if (mode == "constant")
          j = -1;
        else if (mode == "edge")
          j = std::clamp<int64_t>(j, 0, x[i] - 1);
        else
          j = j < 0 ? -j : 2 * (x[i] - 1) - j;  // reflect
      }
      maps[i].push_back(j);
    }
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const DataType t = ctx.in_dtypes[0];
  const auto strides = RowMajorStrides(x);
  return MakeFn([t, out, maps, strides, value](const RunContext& rc) {
    return DispatchBySize(t, [&]<typename T>() {
      const T* in = rc.inputs[0]->values<T>().data();
      T* o = rc.outputs[0]->mutable_values<T>().data();
      const T fill = value.values<T>()[0];
      const int64_t n = Product(out);
      const size_t rank = out.size();
      std::vector<int64_t> idx(rank, 0);
      for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        bool inside = true;
        for (size_t d = 0; d < rank; ++d) {
          const int64_t j = maps[d][idx[d]];
          if (j < 0) {
            inside = false;
            break;
          }
          off += j * strides[d];
        }
        o[i] = inside ? in[off] : fill;
        for (size_t d = rank; d-- > 0;) {
          if (++idx[d] < out[d]) break;
          idx[d] = 0;
        }
      }
    });
  });
}

Status CheckPad(const Node& node, const Graph& graph) {
  const std::string mode = node.GetString("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) + ": mode '" + mode +
                           "' is not supported");
  }
  return Status::Ok();
}

// ---- Resize ----
double OriginalCoordinate(const std::string& mode, double x, double scale, int64_t in,
                          int64_t out) {
  if (mode == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners")
    return out == 1 ? 0.0 : x * static_cast<double>(in - 1) / static_cast<double>(out - 1);
  if (mode == "tf_half_pixel_for_nearest") return (x + 0.5) / scale;
  return x / scale;  // asymmetric
}

int64_t NearestIndex(const std::string& mode, double x) {
  if (mode == "floor") return static_cast<int64_t>(std::floor(x));
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (mode == "round_prefer_ceil") return static_cast<int64_t>(std::floor(x + 0.5));
  return static_cast<int64_t>(std::ceil(x - 0.5));  // round_prefer_floor
}

// Per axis and output coordinate: two input coordinates and the second one's weight
// (nearest: the same coordinate twice).
struct Tap {
  int64_t lo, hi;
  float w;
};

// Resize's output shape, from `sizes` (input 3) or else `scales` (input 2), and the
// scale per axis.
// The axes scales, sizes and roi speak of (opset 18's `axes`; every axis without it).
StatusOr<std::vector<size_t>> ResizeAxes(const PrepareContext& ctx) {
  const int64_t r = static_cast<int64_t>(ctx.in_shapes[0].size());
  std::vector<size_t> axes;
  const auto given = ctx.node().GetInts("axes");
  if (given.empty()) {
    for (int64_t i = 0; i < r; ++i) axes.push_back(static_cast<size_t>(i));
    return axes;
  }
  for (int64_t a : given) {
    auto n = NormalizeAxis(a, r);
    if (!n.ok()) return ctx.Error(n.status().message());
    if (std::find(axes.begin(), axes.end(), static_cast<size_t>(*n)) != axes.end())
      return ctx.Error("axes repeat");
    axes.push_back(static_cast<size_t>(*n));
  }
  return axes;
}

// tf_crop_and_resize's region of interest for every axis (starts, then ends; 0 and 1 for
// axes `axes` leaves out); empty when input 1 is absent or not a known FP32 tensor.
std::vector<float> ResizeRoi(const PrepareContext& ctx, const std::vector<size_t>& axes) {
  const size_t r = ctx.in_shapes[0].size();
  if (!ctx.has_input(1) || !ctx.in_data[1] || ctx.in_dtypes[1] != DataType::kFp32) return {};
  auto given = ctx.in_data[1]->values<float>();
  if (given.size() != 2 * axes.size()) return {};
  std::vector<float> roi(2 * r, 0.f);
  for (size_t i = 0; i < r; ++i) roi[r + i] = 1.f;
  for (size_t k = 0; k < axes.size(); ++k) {
    roi[axes[k]] = given[k];
    roi[r + axes[k]] = given[axes.size() + k];
  }
  return roi;
}

Status ResizeOutput(PrepareContext& ctx, Shape* out, std::vector<double>* scales) {
  const Shape& x = ctx.in_shapes[0];
  const size_t r = x.size();
  ASSIGN_OR_RETURN(const std::vector<size_t> axes, ResizeAxes(ctx));
  *out = x;
  scales->assign(r, 1.0);
  if (ctx.has_input(3) && ctx.in_shapes[3] != Shape{0}) {
    ASSIGN_OR_RETURN(auto sizes, KnownInts(ctx, 3, "sizes"));
    if (sizes.size() != axes.size()) return ctx.Error("sizes must have one entry per axis");
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t i = axes[k];
      if (sizes[k] < 0) return ctx.Error("sizes must be >= 0");
      (*out)[i] = sizes[k];
      (*scales)[i] = x[i] > 0 ? static_cast<double>(sizes[k]) / static_cast<double>(x[i]) : 1.0;
    }
    // keep_aspect_ratio_policy (opset 18): one scale for every listed axis, the
    // smallest (not_larger) or largest (not_smaller) of theirs.
    const std::string policy = ctx.node().GetString("keep_aspect_ratio_policy", "stretch");
    if (policy == "not_larger" || policy == "not_smaller") {
      double scale = policy == "not_larger" ? 1e300 : 0.0;
      for (size_t i : axes)
        scale =
            policy == "not_larger" ? std::min(scale, (*scales)[i]) : std::max(scale, (*scales)[i]);
      for (size_t i : axes) {
        (*scales)[i] = scale;
        (*out)[i] = static_cast<int64_t>(std::round(scale * static_cast<double>(x[i])));
      }
    } else if (policy != "stretch") {
      return ctx.Error("keep_aspect_ratio_policy '" + policy + "' is not supported");
    }
  } else if (ctx.has_input(2)) {
    if (!ctx.in_data[2] || ctx.in_dtypes[2] != DataType::kFp32)
      return ctx.Error("scales must be a constant FP32 tensor");
    auto given = ctx.in_data[2]->values<float>();
    if (given.size() != axes.size()) return ctx.Error("scales must have one entry per axis");
    std::vector<float> s(r, 1.f);
    for (size_t k = 0; k < axes.size(); ++k) s[axes[k]] = given[k];
    // tf_crop_and_resize scales the region of interest's extent, not the input's.
    std::vector<double> extent(r, 1.0);
    if (ctx.node().GetString("coordinate_transformation_mode", "") == "tf_crop_and_resize") {
      const auto roi = ResizeRoi(ctx, axes);
      for (size_t i = 0; i < r && !roi.empty(); ++i) extent[i] = roi[r + i] - roi[i];
    }
    for (size_t i = 0; i < r; ++i) {
      if (!(s[i] > 0) || !std::isfinite(s[i])) return ctx.Error("scales must be positive");
      (*scales)[i] = s[i];
      const double o = std::floor(static_cast<double>(x[i]) * extent[i] * s[i]);
      if (o > 1e12) return ctx.Error("output is too large");
      (*out)[i] = static_cast<int64_t>(o);
    }
  } else {
    return ctx.Error("needs scales or sizes");
  }
  return Status::Ok();
}

// The taps of every output coordinate, per axis, for `mode` "nearest" or "linear".
StatusOr<std::vector<std::vector<Tap>>> ResizeTaps(const PrepareContext& ctx, const Shape& x,
                                                   const Shape& out,
                                                   const std::vector<double>& scales,
                                                   const std::string& mode) {
  const Node& node = ctx.node();
  const std::string coord = node.GetString("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = node.GetString("nearest_mode", "round_prefer_floor");
  std::vector<std::vector<Tap>> taps(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    for (int64_t o = 0; o < out[i]; ++o) {
      if (x[i] == 0) return ctx.Error("cannot resize an empty axis to a non-empty one");
      const double c = OriginalCoordinate(coord, static_cast<double>(o), scales[i], x[i], out[i]);
      if (mode == "nearest") {
        const int64_t j = std::clamp<int64_t>(NearestIndex(nearest, c), 0, x[i] - 1);
        taps[i].push_back({j, j, 0.f});
      } else {
        const double cc = std::clamp(c, 0.0, static_cast<double>(x[i] - 1));
        const int64_t lo = static_cast<int64_t>(std::floor(cc));
        const int64_t hi = std::min(lo + 1, x[i] - 1);
        taps[i].push_back({lo, hi, static_cast<float>(cc - static_cast<double>(lo))});
      }
    }
  }
  return taps;
}

// Nearest: each output element copies the input element its taps name.
StatusOr<std::unique_ptr<Kernel>> NearestResizeKernel(DataType t, Shape out,
                                                      std::vector<std::vector<Tap>> taps,
                                                      std::vector<int64_t> strides) {
  return MakeFn([t, out = std::move(out), taps = std::move(taps),
                 strides = std::move(strides)](const RunContext& rc) {
    return DispatchBySize(t, [&]<typename T>() {
      const T* in = rc.inputs[0]->values<T>().data();
      T* o = rc.outputs[0]->mutable_values<T>().data();
      const int64_t n = Product(out);
      std::vector<int64_t> idx(out.size(), 0);
      for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        for (size_t d = 0; d < out.size(); ++d) off += taps[d][idx[d]].lo * strides[d];
        o[i] = in[off];
        for (size_t d = out.size(); d-- > 0;) {
          if (++idx[d] < out[d]) break;
          idx[d] = 0;
        }
      }
    });
  });
}

// Linear (FP32): each output element is the weighted sum of the 2^k corners of its
// taps over the `active` axes (those that interpolate).
StatusOr<std::unique_ptr<Kernel>> LinearResizeKernel(Shape out, std::vector<std::vector<Tap>> taps,
                                                     std::vector<int64_t> strides,
                                                     std::vector<size_t> active) {
  return MakeFn([out = std::move(out), taps = std::move(taps), strides = std::move(strides),
                 active = std::move(active)](const RunContext& rc) {
    const float* in = rc.inputs[0]->values<float>().data();
    float* o = rc.outputs[0]->mutable_values<float>().data();
    const int64_t n = Product(out);
    const size_t rank = out.size();
    std::vector<int64_t> idx(rank, 0);
    const size_t corners = size_t{1} << active.size();
    for (int64_t i = 0; i < n; ++i) {
      int64_t base = 0;
      for (size_t d = 0; d < rank; ++d) base += taps[d][idx[d]].lo * strides[d];
      float acc = 0.f;
      for (size_t c = 0; c < corners; ++c) {
        int64_t off = base;
        float w = 1.f;
        for (size_t a = 0; a < active.size(); ++a) {
          const size_t d = active[a];
          const auto& tap = taps[d][idx[d]];
          if (c >> a & 1) {
            off += (tap.hi - tap.lo) * strides[d];
            w *= tap.w;
          } else {
            w *= 1.f - tap.w;
          }
        }
        acc += w * in[off];
      }
      o[i] = acc;
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < out[d]) break;
        idx[d] = 0;
      }
    }
    return Status::Ok();
  });
}

// Cubic convolution weights of the four neighbours floor(x) - 1 .. floor(x) + 2 at
// fraction t (Keys' kernel with coefficient a, as ONNX defines it).
std::array<double, 4> CubicWeights(double t, double a) {
  auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };  // 1<d<2
  auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };       // d<=1
  return {far(t + 1), near(t), near(1 - t), far(2 - t)};
}

// Per axis and output coordinate, the general form (resize.h).
using Taps = ResizeSamples;

// Taps for any mode, with tf_crop_and_resize's region of interest (normalised starts
// then ends, one per axis; empty otherwise). Neighbours outside the input repeat its
// edge, or (exclude_outside) drop out and the rest are renormalised.
StatusOr<std::vector<std::vector<Taps>>> GeneralTaps(const PrepareContext& ctx, const Shape& x,
                                                     const Shape& out,
                                                     const std::vector<double>& scales,
                                                     const std::string& mode,
                                                     const std::vector<float>& roi) {
  const Node& node = ctx.node();
  const std::string coord = node.GetString("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = node.GetString("nearest_mode", "round_prefer_floor");
  const double a = node.GetFloat("cubic_coeff_a", -0.75f);
  const bool exclude = node.GetInt("exclude_outside", 0) != 0;
  const bool antialias = node.GetInt("antialias", 0) != 0;
  const size_t r = x.size();
  std::vector<std::vector<Taps>> taps(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t in = x[i];
    for (int64_t o = 0; o < out[i]; ++o) {
      if (in == 0) return ctx.Error("cannot resize an empty axis to a non-empty one");
      Taps t;
      double c;
      if (coord == "tf_crop_and_resize") {
        const double start = roi[i], end = roi[r + i], span = static_cast<double>(in - 1);
        c = out[i] > 1 ? start * span + static_cast<double>(o) * (end - start) * span /
                                            static_cast<double>(out[i] - 1)
                       : 0.5 * (start + end) * span;
        if (c < 0 || c > span) {
          t.outside = true;
          taps[i].push_back(std::move(t));
          continue;
        }
      } else {
        c = OriginalCoordinate(coord, static_cast<double>(o), scales[i], in, out[i]);
      }
      auto clamp = [in](int64_t j) { return std::clamp<int64_t>(j, 0, in - 1); };
      if (antialias && mode != "nearest" && scales[i] < 1.0) {
        // Downscaling with antialias (opset 18): the kernel stretched by 1 / scale over
        // every neighbour it reaches, normalised (ONNX's reference).
        const double sc = scales[i], fl = std::floor(c), ratio = c - fl;
        const double support = mode == "linear" ? 1.0 : 2.0;
        const int64_t start = static_cast<int64_t>(std::floor(-support / sc)) + 1;
        const int64_t end =
            mode == "linear" ? start + static_cast<int64_t>(2 - 2 * start) : 2 - start;
        std::vector<double> w;
        double sum = 0;
        for (int64_t k = start; k < end; ++k) {
          const double d = std::fabs(sc * (static_cast<double>(k) - ratio));
          double wk;
          if (mode == "linear") {
            wk = std::clamp(1.0 - d, 0.0, 1.0);
          } else {
            wk = d <= 1  ? ((a + 2) * d - (a + 3)) * d * d + 1
                 : d < 2 ? ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
                         : 0.0;
          }
          const int64_t j = static_cast<int64_t>(fl) + k;
          if (exclude && (j < 0 || j >= in)) wk = 0;
          w.push_back(wk);
          sum += wk;
        }
        for (int64_t k = start; k < end; ++k) {
          const double wk = sum != 0 ? w[k - start] / sum : 0.0;
          if (wk == 0) continue;
          t.idx.push_back(clamp(static_cast<int64_t>(fl) + k));
          t.w.push_back(static_cast<float>(wk));
        }
      } else if (mode == "nearest") {
        t.idx = {clamp(NearestIndex(nearest, c))};
        t.w = {1.f};
      } else if (mode == "linear") {
        const double cc = std::clamp(c, 0.0, static_cast<double>(in - 1));
        const int64_t lo = static_cast<int64_t>(std::floor(cc));
        const double f = cc - static_cast<double>(lo);
        t.idx = {lo, clamp(lo + 1)};
        t.w = {static_cast<float>(1 - f), static_cast<float>(f)};
      } else {  // cubic
        const double fl = std::floor(c);
        const auto w = CubicWeights(c - fl, a);
        double sum = 0;
        std::array<double, 4> kept{};
        for (int k = 0; k < 4; ++k) {
          const int64_t j = static_cast<int64_t>(fl) - 1 + k;
          kept[k] = exclude && (j < 0 || j >= in) ? 0.0 : w[k];
          sum += kept[k];
        }
        for (int k = 0; k < 4; ++k) {
          const double wk = exclude && sum != 0 ? kept[k] / sum : kept[k];
          if (wk == 0) continue;
          t.idx.push_back(clamp(static_cast<int64_t>(fl) - 1 + k));
          t.w.push_back(static_cast<float>(wk));
        }
      }
      taps[i].push_back(std::move(t));
    }
  }
  return taps;
}

// FP32, any taps: each output element is the weighted sum over every combination of its
// axes' taps, or extrapolation_value when an axis lies outside the crop.
StatusOr<std::unique_ptr<Kernel>> GeneralResizeKernel(Shape out,
                                                      std::vector<std::vector<Taps>> taps,
                                                      std::vector<int64_t> strides,
                                                      float extrapolation) {
  return MakeFn([out = std::move(out), taps = std::move(taps), strides = std::move(strides),
                 extrapolation](const RunContext& rc) {
    const float* in = rc.inputs[0]->values<float>().data();
    float* o = rc.outputs[0]->mutable_values<float>().data();
    const int64_t n = Product(out);
    const size_t rank = out.size();
    std::vector<int64_t> idx(rank, 0);
    std::vector<size_t> k(rank, 0);
    for (int64_t i = 0; i < n; ++i) {
      bool outside = false;
      for (size_t d = 0; d < rank; ++d) outside = outside || taps[d][idx[d]].outside;
      double acc = 0;
      if (!outside) {
        std::fill(k.begin(), k.end(), 0);
        for (;;) {
          int64_t off = 0;
          double w = 1;
          for (size_t d = 0; d < rank; ++d) {
            const Taps& t = taps[d][idx[d]];
            off += t.idx[k[d]] * strides[d];
            w *= t.w[k[d]];
          }
          acc += w * in[off];
          size_t d = rank;
          while (d-- > 0) {
            if (++k[d] < taps[d][idx[d]].idx.size()) break;
            k[d] = 0;
          }
          if (d == SIZE_MAX) break;
        }
      }
      o[i] = outside ? extrapolation : static_cast<float>(acc);
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < out[d]) break;
        idx[d] = 0;
      }
    }
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareResize(PrepareContext& ctx);

// Resize whose `sizes` or `scales` (or tf_crop_and_resize's `roi`) is known only at run
// time (computed from another input's data, or an input itself): its output shape is
// data-dependent (PrepareContext::out_dynamic). Each run prepares Resize from the
// tensors then given, keeping the last preparation for the next run that brings the same
// X shape and the same sizes, scales and roi.
class RunTimeResizeKernel : public Kernel {
 public:
  RunTimeResizeKernel(const Graph* graph, int node_index, int64_t max_bytes)
      : graph_(graph), node_index_(node_index), max_bytes_(max_bytes) {}

  Status Run(const RunContext& rc) override {
    std::string key;
    for (size_t i = 0; i < rc.inputs.size(); ++i) {
      const Tensor* t = rc.inputs[i];
      const int64_t rank = t ? static_cast<int64_t>(t->shape().size()) : -1;
      key.append(reinterpret_cast<const char*>(&rank), sizeof rank);
      if (!t) continue;
      key.append(reinterpret_cast<const char*>(t->shape().data()),
                 t->shape().size() * sizeof(int64_t));
      if (i > 0) key.append(static_cast<const char*>(t->data()), t->byte_size());
    }
    if (!kernel_ || key != key_) {
      PrepareContext ctx;
      ctx.graph = graph_;
      ctx.node_index = node_index_;
      for (size_t i = 0; i < rc.inputs.size(); ++i) {
        const Tensor* t = rc.inputs[i];
        ctx.in_values.push_back(-1);
        ctx.in_dtypes.push_back(t ? t->dtype() : DataType::kInvalid);
        ctx.in_shapes.push_back(t ? t->shape() : Shape{});
        ctx.in_data.push_back(i > 0 ? t : nullptr);
      }
      ctx.SetOutputs(1);
      kernel_.reset();
      // Sizes come from data now: the output is checked before any table is built for
      // it, against the largest tensor the plan may create (PlanLimits::max_tensor_bytes).
      Shape out;
      std::vector<double> scales;
      RETURN_IF_ERROR(ResizeOutput(ctx, &out, &scales));
      const int64_t elem =
          std::max<int64_t>(1, static_cast<int64_t>(DataTypeSize(ctx.in_dtypes[0])));
      auto count = ElementCount(out, max_bytes_ / elem);
      if (!count.ok())
        return ctx.Error("output " + ShapeToString(out) + ": " + count.status().message());
      ASSIGN_OR_RETURN(kernel_, PrepareResize(ctx));
      dtype_ = ctx.out_dtypes[0];
      shape_ = ctx.out_shapes[0];
      key_ = std::move(key);
    }
    *rc.outputs[0] = Tensor::Allocate(dtype_, shape_);
    if (Product(shape_) == 0) return Status::Ok();
    return kernel_->Run(rc);
  }

 private:
  const Graph* graph_;
  int node_index_;
  int64_t max_bytes_;
  std::string key_;  // what kernel_ was prepared for
  std::unique_ptr<Kernel> kernel_;
  DataType dtype_ = DataType::kInvalid;
  Shape shape_;
};

// Whether Resize's output shape or taps depend on data not known now: the sizes or
// scales it uses, or tf_crop_and_resize's roi.
bool ResizeNeedsRunTimeData(const PrepareContext& ctx);

// tf_crop_and_resize's region of interest, required as a constant; empty for other modes.
StatusOr<std::vector<float>> CropRoi(const PrepareContext& ctx) {
  if (ctx.node().GetString("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize")
    return std::vector<float>();
  ASSIGN_OR_RETURN(const auto axes, ResizeAxes(ctx));
  std::vector<float> roi = ResizeRoi(ctx, axes);
  if (roi.empty()) {
    return ctx.Error(
        "tf_crop_and_resize needs roi as a constant FP32 tensor, a start and an end per axis");
  }
  return roi;
}

bool ResizeNeedsRunTimeData(const PrepareContext& ctx) {
  auto unknown = [&](size_t i) {
    return ctx.has_input(i) && ctx.in_data[i] == nullptr && ctx.in_shapes[i] != Shape{0};
  };
  const bool sizes = ctx.has_input(3) && ctx.in_shapes[3] != Shape{0};
  const bool crop =
      ctx.node().GetString("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize";
  return (sizes ? unknown(3) : unknown(2)) || (crop && unknown(1));
}

// Nearest upsampling by a whole factor on every spatial axis (N and C kept), whose taps
// are floor(o / factor): what oneDNN's resampling_nearest computes, in whatever layout
// its source arrives (for a whole factor its rounding of (o + 0.5) / factor - 0.5 is that
// floor). Returns null when `taps` are another mapping.
StatusOr<std::unique_ptr<Kernel>> DnnlNearestUpsample(PrepareContext& ctx, const Shape& x,
                                                      const Shape& out,
                                                      const std::vector<std::vector<Tap>>& taps) {
  // A Resize prepared at run time (RunTimeResizeKernel) has no oneDNN engine in its
  // context, and its source is already plain: it takes the engine's loops.
  if (ctx.dnnl_engine == nullptr || ctx.in_dtypes[0] != DataType::kFp32 || x.size() < 3 ||
      x.size() > 5 || out[0] != x[0] || out[1] != x[1] || Product(x) == 0)
    return std::unique_ptr<Kernel>();
  for (size_t d = 2; d < x.size(); ++d) {
    if (out[d] % x[d] != 0) return std::unique_ptr<Kernel>();
    const int64_t f = out[d] / x[d];
    for (int64_t o = 0; o < out[d]; ++o)
      if (taps[d][static_cast<size_t>(o)].lo != o / f) return std::unique_ptr<Kernel>();
  }
  const auto& eng = *ctx.dnnl_engine;
  const memory::desc src = ctx.InDesc(0, PlainDesc(x, DataType::kFp32));
  const auto dt = static_cast<memory::data_type>(src.data.data_type);
  const memory::desc dst_plain = PlainDesc(out, DataType::kFp32);
  dnnl::resampling_forward::desc d(dnnl::prop_kind::forward_inference,
                                   dnnl::algorithm::resampling_nearest, src,
                                   memory::desc(ToDims(out), dt, memory::format_tag::any));
  dnnl::resampling_forward::primitive_desc pd(d, eng);
  memory::desc dst_out = dst_plain;
  if (ctx.out_any_layout[0] && pd.dst_desc() != dst_plain) {
    dst_out = pd.dst_desc();
    ctx.out_descs[0] = dst_out;
  }
  auto k = std::make_unique<DnnlKernel>();
  k->primitive = dnnl::resampling_forward(pd);
  k->BindInput(DNNL_ARG_SRC, src, eng, 0);
  k->BindOutputAs(DNNL_ARG_DST, pd.dst_desc(), dst_out, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

// The engine's own Resize loops read plain row-major values: a source that arrives in
// another layout (OpDef::any_layout_inputs) is reordered into a plain copy first.
StatusOr<std::unique_ptr<Kernel>> ReadingPlain(PrepareContext& ctx,
                                               StatusOr<std::unique_ptr<Kernel>> inner) {
  // oneDNN's resampling (DnnlNearestUpsample) reads the source's own layout.
  if (!inner.ok() || !*inner || ctx.in_dtypes[0] != DataType::kFp32 ||
      dynamic_cast<DnnlKernel*>(inner->get()) != nullptr)
    return inner;
  const Shape& x = ctx.in_shapes[0];
  const memory::desc plain = PlainDesc(x, DataType::kFp32);
  const memory::desc src = ctx.InDesc(0, plain);
  if (src == plain) return inner;
  std::shared_ptr<Kernel> loop = std::move(*inner);
  const dnnl::engine eng = *ctx.dnnl_engine;
  return MakeFn([loop, src, plain, eng, x](const RunContext& rc) -> Status {
    Tensor copy = Tensor::Allocate(DataType::kFp32, x);
    dnnl::memory from(src, eng, const_cast<void*>(rc.inputs[0]->data()));
    dnnl::memory to(plain, eng, copy.mutable_data());
    if (rc.stream != nullptr) {
      dnnl::reorder(from, to).execute(*rc.stream, from, to);
      rc.stream->wait();
    } else {
      dnnl::stream stream(eng);
      dnnl::reorder(from, to).execute(stream, from, to);
      stream.wait();
    }
    RunContext plain_rc = rc;
    plain_rc.inputs[0] = &copy;
    return loop->Run(plain_rc);
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareResizeLoops(PrepareContext& ctx);

StatusOr<std::unique_ptr<Kernel>> PrepareResize(PrepareContext& ctx) {
  return ReadingPlain(ctx, PrepareResizeLoops(ctx));
}

StatusOr<std::unique_ptr<Kernel>> PrepareResizeLoops(PrepareContext& ctx) {
  if (ctx.num_inputs() < 1 || !ctx.has_input(0)) return ctx.Error("needs X");
  if (ResizeNeedsRunTimeData(ctx)) {
    ctx.out_dtypes[0] = ctx.in_dtypes[0];
    ctx.out_dynamic[0] = 1;
    const int64_t max_bytes = (ctx.limits ? *ctx.limits : PlanLimits()).max_tensor_bytes;
    return std::unique_ptr<Kernel>(new RunTimeResizeKernel(ctx.graph, ctx.node_index, max_bytes));
  }
  const Shape& x = ctx.in_shapes[0];
  std::vector<double> scales;
  Shape out;
  RETURN_IF_ERROR(ResizeOutput(ctx, &out, &scales));
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const std::string mode = ctx.node().GetString("mode", "nearest");
  if (mode == "linear" && ctx.in_dtypes[0] != DataType::kFp32)
    return ctx.Error("linear mode needs FP32");
  const bool crop =
      ctx.node().GetString("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize";
  const bool antialias = ctx.node().GetInt("antialias", 0) != 0 && mode != "nearest";
  if (mode == "cubic" || crop || antialias) {
    if (ctx.in_dtypes[0] != DataType::kFp32)
      return ctx.Error("cubic mode, antialias and tf_crop_and_resize need FP32");
    ASSIGN_OR_RETURN(const std::vector<float> roi, CropRoi(ctx));
    ASSIGN_OR_RETURN(auto general, GeneralTaps(ctx, x, out, scales, mode, roi));
    return GeneralResizeKernel(std::move(out), std::move(general), RowMajorStrides(x),
                               ctx.node().GetFloat("extrapolation_value", 0.f));
  }
  ASSIGN_OR_RETURN(auto taps, ResizeTaps(ctx, x, out, scales, mode));
  if (mode == "nearest") {
    ASSIGN_OR_RETURN(auto dnnl_kernel, DnnlNearestUpsample(ctx, x, out, taps));
    if (dnnl_kernel) return dnnl_kernel;
  }
  auto strides = RowMajorStrides(x);
  if (mode == "nearest")
    return NearestResizeKernel(ctx.in_dtypes[0], std::move(out), std::move(taps),
                               std::move(strides));
  std::vector<size_t> active;  // axes that actually interpolate
  for (size_t i = 0; i < x.size(); ++i)
    if (out[i] != x[i] || scales[i] != 1.0) active.push_back(i);
  return LinearResizeKernel(std::move(out), std::move(taps), std::move(strides), std::move(active));
}

Status CheckResize(const Node& node, const Graph& graph) {
  const std::string who = graph.Describe(&node - graph.nodes.data());
  const std::string mode = node.GetString("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return InvalidArgument(who + ": mode '" + mode + "' is not supported");
  const std::string coord = node.GetString("coordinate_transformation_mode", "half_pixel");
  if (coord != "half_pixel" && coord != "pytorch_half_pixel" && coord != "align_corners" &&
      coord != "asymmetric" && coord != "tf_half_pixel_for_nearest" &&
      coord != "tf_crop_and_resize") {
    return InvalidArgument(who + ": coordinate_transformation_mode '" + coord +
                           "' is not supported");
  }
  const std::string nearest = node.GetString("nearest_mode", "round_prefer_floor");
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" &&
      nearest != "ceil") {
    return InvalidArgument(who + ": nearest_mode '" + nearest + "' is not supported");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ResizeGeometry> ComputeResizeGeometry(const PrepareContext& ctx) {
  if (ctx.num_inputs() < 1 || !ctx.has_input(0)) return ctx.Error("needs X");
  if (ResizeNeedsRunTimeData(ctx))
    return FailedPrecondition(ctx.graph->Describe(ctx.node_index) +
                              ": its sizes, scales or roi are known only at run time");
  // ResizeOutput reports through the context only; a copy keeps the caller's untouched.
  PrepareContext local = ctx;
  ResizeGeometry g;
  std::vector<double> scales;
  RETURN_IF_ERROR(ResizeOutput(local, &g.out, &scales));
  ASSIGN_OR_RETURN(const std::vector<float> roi, CropRoi(ctx));
  ASSIGN_OR_RETURN(g.taps, GeneralTaps(ctx, ctx.in_shapes[0], g.out, scales,
                                       ctx.node().GetString("mode", "nearest"), roi));
  g.extrapolation = ctx.node().GetFloat("extrapolation_value", 0.f);
  return g;
}

void RegisterIndexingOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "Slice", {}, nullptr, PrepareSlice});
  ops->push_back({"", "Gather", {"axis"}, nullptr, PrepareGather});
  ops->push_back({"", "Pad", {"mode"}, CheckPad, PreparePad});
  ops->push_back(
      {"",
       "Resize",
       {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
        "exclude_outside", "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy"},
       CheckResize,
       PrepareResize,
       0b1});
}

}  // namespace shoal::engine::internal

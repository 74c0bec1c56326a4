// LowerPlan (gpu_lowering.h) for the layout and indexing operators: Split, Concat, Slice,
// Pad, Transpose, Gather, Resize, DepthToSpace, RoiAlign, GridSample, Expand,
// GatherElements, the scatters, CumSum and Trilu.

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/data_type.h"
#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/internal/op_util.h"
#include "engine/internal/resize.h"

namespace shoal::engine::cuda::internal {

using engine::internal::Product;

// Split into outputs of the planned shapes, one slice step each.
Status Lowerer::LowerSplit(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0];
  const int64_t words = WordsOf(x);
  if (words == 0) return Fail(n, "only a Split of 4- or 8-byte elements is on the GPU path so far");
  const Shape xs = ShapeOf(x);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  int64_t start = 0;
  for (int o : node.outputs) {
    // An omitted output's length is in the split sizes, not in a planned shape.
    if (o < 0) return Fail(n, "a Split with an omitted output is not on the GPU path yet");
    const Shape os = ShapeOf(o);
    if (os.size() != xs.size()) return Fail(n, "an output of another rank");
    GpuStep step = NewStep(GpuStep::Kind::kSlice, n);
    step.in = {x};
    step.out = o;
    step.dims = InWords(xs, words);
    step.axis = axis;
    step.start = start;
    step.length = os[axis];
    start += os[axis];
    out_.steps.push_back(std::move(step));
  }
  if (start > xs[axis]) return Fail(n, "the outputs are longer than the axis");
  return Status::Ok();
}

// Concat: each input written into the output at its offset along the axis.
Status Lowerer::LowerConcat(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckPlain(n));
  const int y = node.outputs[0];
  const int64_t words = WordsOf(y);
  if (words == 0)
    return Fail(n, "only a Concat of 4- or 8-byte elements is on the GPU path so far");
  for (int x : node.inputs)
    if (x >= 0 && DtypeOf(x) != DtypeOf(y)) return Fail(n, "an input of another type");
  const Shape ys = ShapeOf(y);
  const auto rank = static_cast<int64_t>(ys.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  int64_t start = 0;
  for (int x : node.inputs) {
    if (x < 0) continue;
    const Shape xs = ShapeOf(x);
    if (static_cast<int64_t>(xs.size()) != rank) return Fail(n, "an input of another rank");
    if (Product(xs) > 0) {
      GpuStep step = NewStep(GpuStep::Kind::kPlace, n);
      step.in = {x};
      step.out = y;
      step.dims = InWords(ys, words);
      step.words = words;
      step.axis = axis;
      step.start = start;
      out_.steps.push_back(std::move(step));
    }
    start += xs[axis];
  }
  if (start != ys[axis]) return Fail(n, "the inputs do not fill the output");
  return Status::Ok();
}

// Slice with starts, ends, axes and steps known at load (inputs from opset 10, attributes
// before), clamped as ONNX (and the CPU engine, ops/indexing.cc) clamps them.
Status Lowerer::LowerSlice(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0], y = node.outputs[0];
  const int64_t words = WordsOf(x);
  if (words == 0 || DtypeOf(y) != DtypeOf(x))
    return Fail(n, "only a Slice of 4- or 8-byte elements is on the GPU path so far");
  const Shape xs = ShapeOf(x);
  const auto rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (graph_.opset < 10) {
    starts = node.GetInts("starts");
    ends = node.GetInts("ends");
    axes = node.GetInts("axes");
  } else {
    std::vector<int64_t>* lists[] = {&starts, &ends, &axes, &steps};
    for (size_t i = 1; i <= 4; ++i) {
      if (!node.has_input(i)) continue;
      const Tensor* t = Known(node.inputs[i]);
      if (!t || (t->dtype() != DataType::kInt64 && t->dtype() != DataType::kInt32))
        return Fail(n, "starts, ends, axes and steps computed at run time are not on the GPU path");
      for (int64_t k = 0; k < t->element_count(); ++k)
        lists[i - 1]->push_back(t->dtype() == DataType::kInt64 ? t->values<int64_t>()[k]
                                                               : t->values<int32_t>()[k]);
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return Fail(n, "starts, ends, axes and steps differ in length");
  std::vector<int64_t> begin(xs.size(), 0), step(xs.size(), 1);
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t ax = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (ax < 0 || ax >= rank || steps[i] == 0)
      return Fail(n, "an axis out of range or a zero step");
    const int64_t d = xs[ax];
    int64_t b = starts[i] < 0 ? starts[i] + d : starts[i];
    // An empty axis gives an empty output whatever the start (and clamp needs low <= high).
    b = d == 0 ? 0 : steps[i] > 0 ? std::clamp<int64_t>(b, 0, d) : std::clamp<int64_t>(b, 0, d - 1);
    begin[ax] = b;
    step[ax] = steps[i];
  }
  if (words > 1) {  // each element's words, in order
    begin.push_back(0);
    step.push_back(1);
  }
  auto plan = PlanSlice(InWords(xs, words), begin, step, InWords(ShapeOf(y), words));
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep s = NewStep(GpuStep::Kind::kStridedSlice, n);
  s.in = {x};
  s.out = y;
  s.slice = std::move(plan).value();
  out_.steps.push_back(std::move(s));
  return Status::Ok();
}

// Pad in every mode the CPU engine has (constant, edge, reflect), with pads (and the
// value) known at load.
Status Lowerer::LowerPad(int n) {
  const Node& node = graph_.nodes[n];
  if (!IsFp32(node.inputs[0]) || !IsFp32(node.outputs[0]))
    return Fail(n, "only a Pad of fp32 data is on the GPU path so far");
  const Shape xs = ShapeOf(node.inputs[0]);
  std::vector<int64_t> pads = node.GetInts("pads");
  float value = node.GetFloat("value", 0.f);
  if (graph_.opset >= 11) {
    const Tensor* p = node.has_input(1) ? Known(node.inputs[1]) : nullptr;
    if (!p || p->dtype() != DataType::kInt64)
      return Fail(n, "pads computed at run time are not on the GPU path");
    auto v = p->values<int64_t>();
    pads.assign(v.begin(), v.end());
    if (node.has_input(2)) {
      const Tensor* c = Known(node.inputs[2]);
      if (!c || c->dtype() != DataType::kFp32 || c->element_count() != 1)
        return Fail(n, "a padding value computed at run time is not on the GPU path");
      value = c->values<float>()[0];
    }
    if (node.has_input(3)) {
      // Opset 18's axes: pads speaks of these axes only (starts, then ends).
      const auto axes = KnownInts(node.inputs[3]);
      if (!axes) return Fail(n, "axes computed at run time are not on the GPU path");
      const auto rank = static_cast<int64_t>(xs.size());
      if (pads.size() != 2 * axes->size()) return Fail(n, "pads need a begin and an end per axis");
      std::vector<int64_t> full(2 * xs.size(), 0);
      std::vector<char> seen(xs.size(), 0);
      for (size_t i = 0; i < axes->size(); ++i) {
        int64_t a = (*axes)[i];
        if (a < 0) a += rank;
        if (a < 0 || a >= rank || seen[static_cast<size_t>(a)]++)
          return Fail(n, "an axis out of range or repeated");
        full[static_cast<size_t>(a)] = pads[i];
        full[static_cast<size_t>(a) + xs.size()] = pads[axes->size() + i];
      }
      pads = std::move(full);
    }
  }
  if (pads.size() != 2 * xs.size()) return Fail(n, "pads need a begin and an end per axis");
  const std::vector<int64_t> begin(pads.begin(), pads.begin() + xs.size());
  const std::vector<int64_t> end(pads.begin() + xs.size(), pads.end());
  auto plan = PlanPad(xs, begin, end, node.GetString("mode", "constant"));
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(node.outputs[0]))
    return Fail(n, "the padded shape differs from the planned output");
  GpuStep step = NewStep(GpuStep::Kind::kPad, n);
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.pad = std::move(plan).value();
  step.alpha = value;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerTranspose(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  std::vector<int64_t> perm = node.GetInts("perm");
  if (perm.empty())
    for (size_t i = xs.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  auto plan = PlanTranspose(xs, perm);
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep step = NewStep(GpuStep::Kind::kTranspose, n);
  step.in = {node.inputs[0]};
  step.transpose = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerGather(int n) {
  const Node& node = graph_.nodes[n];
  // The kernel moves 4-byte words: data of 8-byte elements is gathered as pairs of them.
  const DataType dtype = node.inputs.size() == 2 ? DtypeOf(node.inputs[0]) : DataType::kInvalid;
  const size_t element = DataTypeSize(dtype);
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1) ||
      (element != 4 && element != 8) || !node.has_output(0) || DtypeOf(node.outputs[0]) != dtype)
    return Fail(n,
                "only a Gather of 4- or 8-byte elements (fp32, int32, int64) is on the GPU path");
  RETURN_IF_ERROR(CheckPlain(n));
  if (DtypeOf(node.inputs[1]) != DataType::kInt64)
    return Fail(n, "only int64 indices are on the GPU path so far");
  auto plan = PlanGather(ShapeOf(node.inputs[0]), ShapeOf(node.inputs[1]), node.GetInt("axis", 0));
  if (!plan.ok()) return Fail(n, plan.status().message());
  plan->inner *= static_cast<int64_t>(element / 4);
  GpuStep step = NewStep(GpuStep::Kind::kGather, n);
  step.flag = NewFlag(n);
  step.in = {node.inputs[0], node.inputs[1]};
  step.gather = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Resize in any mode the CPU engine runs, over fp32 values: the CPU engine's own taps
// (engine/internal/resize.h) as two constant tables, and one kernel that sums each output
// element's weighted taps.
Status Lowerer::LowerResize(int n) {
  const Node& node = graph_.nodes[n];
  if (!node.has_input(0) || !IsFp32(node.inputs[0]) || !node.has_output(0) ||
      !IsFp32(node.outputs[0]))
    return Fail(n, "only a Resize of fp32 values is on the GPU path so far");
  RETURN_IF_ERROR(CheckPlain(n));
  PrepareContext ctx;
  ctx.graph = &graph_;
  ctx.node_index = n;
  for (int v : node.inputs) {
    ctx.in_values.push_back(v);
    ctx.in_dtypes.push_back(v >= 0 ? DtypeOf(v) : DataType::kInvalid);
    ctx.in_shapes.push_back(v >= 0 ? ShapeOf(v) : Shape{});
    ctx.in_data.push_back(v >= 0 ? Known(v) : nullptr);
  }
  // The CPU's linear loop interpolates only the resized axes; this coordinate mode would
  // give the others half-pixel taps in the general form the GPU reads.
  if (node.GetString("mode", "nearest") != "nearest" &&
      node.GetString("coordinate_transformation_mode", "half_pixel") == "tf_half_pixel_for_nearest")
    return Fail(n, "tf_half_pixel_for_nearest outside nearest mode is not on the GPU path");
  auto geometry = engine::internal::ComputeResizeGeometry(ctx);
  if (!geometry.ok()) return Fail(n, geometry.status().message());
  const Shape xs = ShapeOf(node.inputs[0]);
  if (geometry->out != ShapeOf(node.outputs[0]))
    return Fail(n, "the resized shape differs from the planned output");
  std::vector<ResizeAxis> axes;
  for (size_t d = 0; d < xs.size(); ++d) {
    ResizeAxis a;
    a.in = xs[d];
    a.out = geometry->out[d];
    // Taps of weight 0 add nothing: dropped, an axis that is not resized (linear's second
    // tap, weight 0) takes one per coordinate, and each element fewer combinations.
    for (auto& s : geometry->taps[d]) {
      size_t kept = 0;
      for (size_t t = 0; t < s.idx.size(); ++t) {
        if (s.w[t] == 0.f && !(kept == 0 && t + 1 == s.idx.size())) continue;
        s.idx[kept] = s.idx[t];
        s.w[kept++] = s.w[t];
      }
      s.idx.resize(kept);
      s.w.resize(kept);
      a.taps = std::max<int64_t>(a.taps, static_cast<int64_t>(kept));
    }
    for (const auto& s : geometry->taps[d]) {
      for (int64_t t = 0; t < a.taps; ++t) {
        const bool used = !s.outside && t < static_cast<int64_t>(s.idx.size());
        a.idx.push_back(s.outside && t == 0 ? -1 : used ? s.idx[t] : 0);
        a.w.push_back(used ? s.w[t] : 0.f);
      }
    }
    axes.push_back(std::move(a));
  }
  auto plan = PlanResize(axes);
  if (!plan.ok()) return Fail(n, plan.status().message());
  // The tables as constants, keyed by their content: another shape's plan with the same
  // taps shares them.
  auto table = [this](const void* data, size_t bytes, DataType dtype, const char* what) {
    const int64_t count = static_cast<int64_t>(bytes / DataTypeSize(dtype));
    Tensor t = Tensor::Allocate(dtype, {count});
    if (bytes > 0) std::memcpy(t.mutable_data(), data, bytes);
    char hash[24];
    std::snprintf(hash, sizeof(hash), "#%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(data, bytes)));
    return AddBlob(std::string("resize-") + what + hash, std::move(t));
  };
  GpuStep step = NewStep(GpuStep::Kind::kResize, n);
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.weight_slots = {
      table(plan->idx.data(), plan->idx.size() * sizeof(int64_t), DataType::kInt64, "idx"),
      table(plan->w.data(), plan->w.size() * sizeof(float), DataType::kFp32, "w")};
  step.alpha = geometry->extrapolation;
  plan->idx.clear();
  plan->w.clear();
  step.resize = std::move(plan).value();
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// DepthToSpace (DCR, CRD) and SpaceToDepth: one transpose of a 6-D view of the input.
Status Lowerer::LowerDepthSpace(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  const int64_t b = node.GetInt("blocksize", 0);
  if (xs.size() != 4 || b <= 0) return Fail(n, "needs a 4-D input and a positive blocksize");
  const int64_t batch = xs[0], c = xs[1], h = xs[2], w = xs[3];
  std::vector<int64_t> view, perm;
  if (node.op_type == "DepthToSpace") {
    if (c % (b * b) != 0) return Fail(n, "the channels are not a multiple of blocksize^2");
    if (node.GetString("mode", "DCR") == "CRD") {
      view = {batch, c / (b * b), b, b, h, w};
      perm = {0, 1, 4, 2, 5, 3};
    } else {
      view = {batch, b, b, c / (b * b), h, w};
      perm = {0, 3, 4, 1, 5, 2};
    }
  } else {
    if (h % b != 0 || w % b != 0) return Fail(n, "height and width are not multiples of blocksize");
    view = {batch, c, h / b, b, w / b, b};
    perm = {0, 3, 5, 1, 2, 4};
  }
  auto plan = PlanTranspose(view, perm);
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (Product(plan->out_dims) != Product(ShapeOf(node.outputs[0])))
    return Fail(n, "the planned output has another size");
  GpuStep step = NewStep(GpuStep::Kind::kTranspose, n);
  step.in = {node.inputs[0]};
  step.transpose = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// RoiAlign as the CPU engine reads it (ops/sampling.cc): opset 16's
// coordinate_transformation_mode, output_half_pixel before it.
Status Lowerer::LowerRoiAlign(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 3 || !node.has_input(0) || !node.has_input(1) || !node.has_input(2))
    return Fail(n, "needs X, rois and batch_indices");
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], rois = node.inputs[1], batch = node.inputs[2];
  if (!IsFp32(x) || !IsFp32(rois) || !IsFp32(node.outputs[0]))
    return Fail(n, "X, rois and the output must be fp32");
  if (DtypeOf(batch) != DataType::kInt64)
    return Fail(n, "batch_indices must be int64 on the GPU path");
  const Shape xs = ShapeOf(x), rs = ShapeOf(rois);
  if (xs.size() != 4 || rs.size() != 2 || rs[1] != 4) return Fail(n, "X must be 4-D, rois [R, 4]");
  RoiAlignGeometry g;
  g.n = xs[0];
  g.c = xs[1];
  g.h = xs[2];
  g.w = xs[3];
  g.rois = rs[0];
  g.max = node.GetString("mode", "avg") == "max";
  const std::string coord = node.GetString("coordinate_transformation_mode",
                                           graph_.opset >= 16 ? "half_pixel" : "output_half_pixel");
  if (coord != "half_pixel" && coord != "output_half_pixel")
    return Fail(n, "coordinate_transformation_mode '" + coord + "' is not supported");
  g.half_pixel = coord == "half_pixel";
  g.out_h = node.GetInt("output_height", 1);
  g.out_w = node.GetInt("output_width", 1);
  g.sampling_ratio = node.GetInt("sampling_ratio", 0);
  g.spatial_scale = node.GetFloat("spatial_scale", 1.f);
  if (g.out_h < 1 || g.out_w < 1 || g.sampling_ratio < 0)
    return Fail(n, "output sizes must be at least 1 and sampling_ratio at least 0");
  if (ShapeOf(node.outputs[0]) != Shape{g.rois, g.c, g.out_h, g.out_w})
    return Fail(n, "the output's shape differs from the planned one");
  GpuStep step = NewStep(GpuStep::Kind::kRoiAlign, n);
  step.flag = NewFlag(n);
  step.in = {x, rois, batch};
  step.out = node.outputs[0];
  step.roi = g;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// GridSample as the CPU engine reads it (ops/sampling.cc): 4-D in every mode, 5-D (volumes)
// linear and nearest.
Status Lowerer::LowerGridSample(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "needs X and grid");
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]), gs = ShapeOf(node.inputs[1]);
  GridGeometry g;
  const std::string mode = node.GetString("mode", graph_.opset >= 20 ? "linear" : "bilinear");
  if (mode == "bilinear" || mode == "linear") {
    g.mode = 0;
  } else if (mode == "nearest") {
    g.mode = 1;
  } else if (mode == "bicubic" || mode == "cubic") {
    g.mode = 2;
  } else {
    return Fail(n, "mode '" + mode + "' is not supported");
  }
  const std::string pad = node.GetString("padding_mode", "zeros");
  g.padding = pad == "zeros" ? 0 : pad == "border" ? 1 : pad == "reflection" ? 2 : -1;
  if (g.padding < 0) return Fail(n, "padding_mode '" + pad + "' is not supported");
  g.align_corners = node.GetInt("align_corners", 0) != 0;
  g.volume = xs.size() == 5;
  if (g.volume) {
    if (g.mode == 2) return Fail(n, "cubic sampling of a volume is not defined");
    if (gs.size() != 5 || gs[0] != xs[0] || gs[4] != 3) return Fail(n, "the grid does not fit X");
    g.d = xs[2];
    g.h = xs[3];
    g.w = xs[4];
    g.out_d = gs[1];
    g.out_h = gs[2];
    g.out_w = gs[3];
  } else {
    if (xs.size() != 4 || gs.size() != 4 || gs[0] != xs[0] || gs[3] != 2)
      return Fail(n, "X must be 4-D with a grid [N, H_out, W_out, 2], or 5-D");
    g.h = xs[2];
    g.w = xs[3];
    g.out_h = gs[1];
    g.out_w = gs[2];
  }
  g.n = xs[0];
  g.c = xs[1];
  GpuStep step = NewStep(GpuStep::Kind::kGridSample, n);
  step.in = {node.inputs[0], node.inputs[1]};
  step.out = node.outputs[0];
  step.grid = g;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// x (4- or 8-byte elements) viewed as `in` copied onto `out` by one strided copy that reads
// each axis where `in` has 1 and `out` more with stride 0 (ONNX Expand's rule); `what`
// names the operator in the error.
Status Lowerer::AddBroadcastCopy(int n, const Shape& in, const Shape& out, const char* what) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], y = node.outputs[0];
  const int64_t words = WordsOf(x);
  if (words == 0 || DtypeOf(y) != DtypeOf(x))
    return Fail(
        n, std::string("only ") + what + " of 4- or 8-byte elements is on the GPU path so far");
  auto plan = PlanExpand(InWords(in, words), InWords(out, words));
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep s = NewStep(GpuStep::Kind::kStridedSlice, n);
  s.in = {x};
  s.out = y;
  s.slice = std::move(plan).value();
  out_.steps.push_back(std::move(s));
  return Status::Ok();
}

// Expand: the planned output shape (the CPU plan read the shape input) filled by a strided
// copy that reads each broadcast axis with stride 0.
Status Lowerer::LowerExpand(int n) {
  const Node& node = graph_.nodes[n];
  return AddBroadcastCopy(n, ShapeOf(node.inputs[0]), ShapeOf(node.outputs[0]), "an Expand");
}

// Tile: x [d0, d1, ...] repeated r_i times along axis i is x viewed as [1, d0, 1, d1, ...]
// (a unit axis before each repeated one) expanded onto [r0, d0, r1, d1, ...], whose bytes
// are the output's: one strided copy with zero strides on the repeats, as Expand.
Status Lowerer::LowerTile(int n) {
  const Node& node = graph_.nodes[n];
  const auto repeats = node.has_input(1) ? KnownInts(node.inputs[1]) : std::nullopt;
  if (!repeats) return Fail(n, "repeats computed at run time are not on the GPU path");
  const Shape xs = ShapeOf(node.inputs[0]);
  if (repeats->size() != xs.size()) return Fail(n, "repeats must have one value per axis");
  Shape in, out;
  for (size_t i = 0; i < xs.size(); ++i) {
    if ((*repeats)[i] < 0) return Fail(n, "a negative repeat");
    if ((*repeats)[i] != 1) {
      in.push_back(1);
      out.push_back((*repeats)[i]);
    }
    in.push_back(xs[i]);
    out.push_back(xs[i]);
  }
  if (Product(out) != Product(ShapeOf(node.outputs[0])))
    return Fail(n, "the output's shape does not match");
  return AddBroadcastCopy(n, in, out, "a Tile");
}

StatusOr<int64_t> Lowerer::ElementsAxis(int n, const Shape& xs, const Shape& is) const {
  const auto rank = static_cast<int64_t>(xs.size());
  if (rank == 0 || rank > internal::kMaxRank || static_cast<int64_t>(is.size()) != rank)
    return Fail(n, "data and indices must have one rank, from 1 to 8");
  int64_t axis = graph_.nodes[n].GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "the axis is out of range");
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && is[d] > xs[d]) return Fail(n, "the indices do not fit the data");
  return axis;
}

Status Lowerer::CheckGather(int n, const char* what) const {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes data and indices");
  RETURN_IF_ERROR(CheckPlain(n));
  const int data = node.inputs[0], idx = node.inputs[1], y = node.outputs[0];
  if (WordsOf(data) == 0 || DtypeOf(y) != DtypeOf(data))
    return Fail(
        n, std::string("only ") + what + " of 4- or 8-byte elements is on the GPU path so far");
  if (DtypeOf(idx) != DataType::kInt64) return Fail(n, "only int64 indices are on the GPU path");
  return Status::Ok();
}

// GatherElements of fp32 or int64 data (any 4- or 8-byte elements, moved as bits) by int64
// indices: one thread per output element.
Status Lowerer::LowerGatherElements(int n) {
  RETURN_IF_ERROR(CheckGather(n, "a GatherElements"));
  const Node& node = graph_.nodes[n];
  const int data = node.inputs[0], idx = node.inputs[1], y = node.outputs[0];
  const Shape xs = ShapeOf(data), is = ShapeOf(idx);
  ASSIGN_OR_RETURN(const int64_t axis, ElementsAxis(n, xs, is));
  if (ShapeOf(y) != is) return Fail(n, "the output's shape is not the indices'");
  GpuStep step = NewStep(GpuStep::Kind::kGatherElements, n);
  step.flag = NewFlag(n);
  step.in = {data, idx};
  step.out = y;
  step.dims = xs;
  step.axis = axis;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// GatherND of 4- or 8-byte elements by int64 tuples, batch_dims as the CPU engine takes
// them: one thread per output element; a tuple out of range raises the node's flag.
Status Lowerer::LowerGatherNd(int n) {
  RETURN_IF_ERROR(CheckGather(n, "a GatherND"));
  const Node& node = graph_.nodes[n];
  const int data = node.inputs[0], idx = node.inputs[1], y = node.outputs[0];
  const Shape xs = ShapeOf(data), is = ShapeOf(idx);
  const auto r = static_cast<int64_t>(xs.size()), q = static_cast<int64_t>(is.size());
  const int64_t bd = node.GetInt("batch_dims", 0);
  if (q < 1 || r < 1) return Fail(n, "data and indices must have rank >= 1");
  const int64_t k = is.back();
  if (bd < 0 || bd >= std::min(q, r) || k < 1 || k > r - bd || k > internal::kMaxRank)
    return Fail(n, "the indices' last dimension and batch_dims do not fit the data");
  internal::GatherNdIndex index;
  index.k = static_cast<int>(k);
  for (int64_t d = 0; d < k; ++d) index.dims[d] = xs[bd + d];
  index.per_batch = Product(is, bd, q - 1);
  index.slice = Product(xs, bd + k);
  index.batch_stride = Product(xs, bd);
  Shape want(is.begin(), is.end() - 1);
  want.insert(want.end(), xs.begin() + bd + k, xs.end());
  if (ShapeOf(y) != want) return Fail(n, "the output's shape does not fit data and indices");
  GpuStep step = NewStep(GpuStep::Kind::kGatherNd, n);
  step.flag = NewFlag(n);
  step.in = {data, idx};
  step.out = y;
  step.gather_nd = index;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// ScatterElements and ScatterND of fp32 data by int64 indices, every reduction the CPU
// engine has. The output is the data copied, then the updates; with no reduction an int32
// scratch temporary records the last update naming each element.
Status Lowerer::LowerScatter(int n) {
  const Node& node = graph_.nodes[n];
  const bool nd = node.op_type == "ScatterND";
  if (node.inputs.size() != 3 || !node.has_input(0) || !node.has_input(1) || !node.has_input(2))
    return Fail(n, "takes data, indices and updates");
  RETURN_IF_ERROR(CheckPlain(n));
  const int data = node.inputs[0], idx = node.inputs[1], upd = node.inputs[2], y = node.outputs[0];
  if (!IsFp32(data) || !IsFp32(upd) || !IsFp32(y))
    return Fail(n, "only a scatter of fp32 data is on the GPU path so far");
  if (DtypeOf(idx) != DataType::kInt64) return Fail(n, "only int64 indices are on the GPU path");
  static constexpr std::pair<std::string_view, ScatterReduction> kReductions[] = {
      {"none", ScatterReduction::kNone},
      {"add", ScatterReduction::kAdd},
      {"mul", ScatterReduction::kMul},
      {"max", ScatterReduction::kMax},
      {"min", ScatterReduction::kMin}};
  const std::string r = node.GetString("reduction", "none");
  std::optional<ScatterReduction> reduction;
  for (const auto& [name, value] : kReductions)
    if (r == name) reduction = value;
  if (!reduction) return Fail(n, "reduction '" + r + "' is not on the GPU path");
  const Shape xs = ShapeOf(data), is = ShapeOf(idx), us = ShapeOf(upd);
  const auto rank = static_cast<int64_t>(xs.size());
  if (rank == 0 || rank > internal::kMaxRank) return Fail(n, "data must have rank 1 to 8");
  // Update positions are int32 in the kernels (the scratch's atomicMax).
  if (Product(us) > INT32_MAX) return Fail(n, "more than 2^31 - 1 updates");
  GpuStep step = NewStep(nd ? GpuStep::Kind::kScatterNd : GpuStep::Kind::kScatterElements, n);
  if (nd) {
    if (is.empty() || is.back() < 1 || is.back() > rank)
      return Fail(n, "the indices' last dimension must be in [1, rank of data]");
    Shape want(is.begin(), is.end() - 1);
    want.insert(want.end(), xs.begin() + is.back(), xs.end());
    if (us != want) return Fail(n, "the updates' shape does not fit data and indices");
  } else {
    if (us != is) return Fail(n, "the updates' shape is not the indices'");
    ASSIGN_OR_RETURN(step.axis, ElementsAxis(n, xs, is));
  }
  if (ShapeOf(y) != xs) return Fail(n, "the output's shape is not the data's");
  step.flag = NewFlag(n);
  step.in = {data, idx, upd};
  step.out = y;
  step.dims = xs;
  step.scatter = *reduction;
  if (*reduction == ScatterReduction::kNone) step.scratch = NewTemp(xs, DataType::kInt32);
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// CumSum of fp32 or int64 data along a constant axis: one thread per line along it.
Status Lowerer::LowerCumSum(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes x and axis");
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], y = node.outputs[0];
  const DataType dtype = DtypeOf(x);
  if ((dtype != DataType::kFp32 && dtype != DataType::kInt64) || DtypeOf(y) != dtype)
    return Fail(n, "only a CumSum of fp32 or int64 values is on the GPU path so far");
  const auto axes = KnownInts(node.inputs[1]);
  if (!axes || axes->size() != 1)
    return Fail(n, "an axis computed at run time is not on the GPU path");
  const Shape xs = ShapeOf(x);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = (*axes)[0];
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "the axis is out of range");
  GpuStep step = NewStep(GpuStep::Kind::kCumSum, n);
  step.in = {x};
  step.out = y;
  const auto at = static_cast<size_t>(axis);
  step.dims = {Product(xs, 0, at), xs[at], Product(xs, at + 1)};
  step.exclusive = node.GetInt("exclusive", 0) != 0;
  step.reverse = node.GetInt("reverse", 0) != 0;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Trilu of 4- or 8-byte elements (fp32, int64) with a constant k (0 when absent).
Status Lowerer::LowerTrilu(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.empty() || !node.has_input(0)) return Fail(n, "takes an input");
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], y = node.outputs[0];
  if (WordsOf(x) == 0 || DtypeOf(y) != DtypeOf(x))
    return Fail(n, "only a Trilu of 4- or 8-byte elements is on the GPU path so far");
  int64_t k = 0;
  if (node.has_input(1)) {
    const auto ks = KnownInts(node.inputs[1]);
    if (!ks || ks->size() != 1) return Fail(n, "a k computed at run time is not on the GPU path");
    k = (*ks)[0];
  }
  const Shape xs = ShapeOf(x);
  if (xs.size() < 2) return Fail(n, "the input must have rank 2 or more");
  GpuStep step = NewStep(GpuStep::Kind::kTrilu, n);
  step.in = {x};
  step.out = y;
  step.dims = {Product(xs, 0, xs.size() - 2), xs[xs.size() - 2], xs.back()};
  step.upper = node.GetInt("upper", 1) != 0;
  step.start = k;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

}  // namespace shoal::engine::cuda::internal

// Sampling an image at computed coordinates: RoiAlign (regions of interest pooled to a
// fixed size) and GridSample (the image read at a grid of normalised coordinates). FP32,
// the engine's own loops; 4-D images (N, C, H, W), and for GridSample also volumes
// (N, C, D, H, W) in its linear (trilinear) and nearest modes.
#include <algorithm>
#include <array>
#include <cmath>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

// ---- RoiAlign ----

struct RoiAlignParams {
  bool max = false;
  bool half_pixel = true;  // coordinate_transformation_mode; else output_half_pixel
  int64_t out_h = 1, out_w = 1, sampling_ratio = 0;
  float spatial_scale = 1.f;
  int64_t n = 0, c = 0, h = 0, w = 0, rois = 0;
};

// Bilinear sample of one channel plane at (y, x), as ONNX's RoiAlign takes it: nothing
// outside [-1, size], the coordinate clamped to the plane inside. Writes the four
// weighted corner values.
void RoiSample(const float* plane, int64_t h, int64_t w, float y, float x, float out[4]) {
  out[0] = out[1] = out[2] = out[3] = 0.f;
  if (h <= 0 || w <= 0) return;  // an empty plane has nothing to sample
  if (y < -1.f || y > static_cast<float>(h) || x < -1.f || x > static_cast<float>(w)) return;
  y = std::max(y, 0.f);
  x = std::max(x, 0.f);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1, x1;
  if (y0 >= h - 1) {
    y0 = y1 = h - 1;
    y = static_cast<float>(y0);
  } else {
    y1 = y0 + 1;
  }
  if (x0 >= w - 1) {
    x0 = x1 = w - 1;
    x = static_cast<float>(x0);
  } else {
    x1 = x0 + 1;
  }
  const float ly = y - static_cast<float>(y0), lx = x - static_cast<float>(x0);
  const float hy = 1.f - ly, hx = 1.f - lx;
  out[0] = hy * hx * plane[y0 * w + x0];
  out[1] = hy * lx * plane[y0 * w + x1];
  out[2] = ly * hx * plane[y1 * w + x0];
  out[3] = ly * lx * plane[y1 * w + x1];
}

StatusOr<std::unique_ptr<Kernel>> PrepareRoiAlign(PrepareContext& ctx) {
  if (ctx.num_inputs() != 3 || !ctx.has_input(0) || !ctx.has_input(1) || !ctx.has_input(2))
    return ctx.Error("needs X, rois and batch_indices");
  if (ctx.in_dtypes[0] != DataType::kFp32 || ctx.in_dtypes[1] != DataType::kFp32)
    return ctx.Error("X and rois must be FP32");
  if (!IsInteger(ctx.in_dtypes[2])) return ctx.Error("batch_indices must be integers");
  const Shape& x = ctx.in_shapes[0];
  const Shape& rois = ctx.in_shapes[1];
  if (x.size() != 4) return ctx.Error("X must be [N, C, H, W]");
  if (rois.size() != 2 || rois[1] != 4) return ctx.Error("rois must be [num_rois, 4]");
  if (ctx.in_shapes[2] != Shape{rois[0]}) return ctx.Error("batch_indices must be [num_rois]");
  const Node& node = ctx.node();
  RoiAlignParams p;
  p.max = node.GetString("mode", "avg") == "max";
  // Opset 16 added the attribute, defaulting to half_pixel; before, the behaviour was
  // what it calls output_half_pixel.
  const std::string coord = node.GetString("coordinate_transformation_mode",
                                           ctx.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  p.half_pixel = coord == "half_pixel";
  p.out_h = node.GetInt("output_height", 1);
  p.out_w = node.GetInt("output_width", 1);
  p.sampling_ratio = node.GetInt("sampling_ratio", 0);
  p.spatial_scale = node.GetFloat("spatial_scale", 1.f);
  if (p.out_h < 1 || p.out_w < 1) return ctx.Error("output_height and output_width must be >= 1");
  if (p.sampling_ratio < 0) return ctx.Error("sampling_ratio must be >= 0");
  p.n = x[0];
  p.c = x[1];
  p.h = x[2];
  p.w = x[3];
  p.rois = rois[0];
  ctx.out_shapes[0] = Shape{p.rois, p.c, p.out_h, p.out_w};
  ctx.out_dtypes[0] = DataType::kFp32;
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([p, who](const RunContext& rc) -> Status {
    const float* xs = rc.inputs[0]->values<float>().data();
    const float* boxes = rc.inputs[1]->values<float>().data();
    ASSIGN_OR_RETURN(auto batch, ReadInts(*rc.inputs[2]));
    float* out = rc.outputs[0]->mutable_values<float>().data();
    const float offset = p.half_pixel ? 0.5f : 0.f;
    for (int64_t r = 0; r < p.rois; ++r) {
      if (batch[r] < 0 || batch[r] >= p.n)
        return InvalidArgument(who + ": batch index " + std::to_string(batch[r]) +
                               " is out of range");
      const float* b = boxes + r * 4;  // x1, y1, x2, y2
      const float x1 = b[0] * p.spatial_scale - offset, y1 = b[1] * p.spatial_scale - offset;
      float rw = b[2] * p.spatial_scale - offset - x1, rh = b[3] * p.spatial_scale - offset - y1;
      if (!p.half_pixel) {
        rw = std::max(rw, 1.f);
        rh = std::max(rh, 1.f);
      }
      const float bin_h = rh / static_cast<float>(p.out_h);
      const float bin_w = rw / static_cast<float>(p.out_w);
      // An adaptive grid takes ceil(bin) samples per axis: a box far larger than the input,
      // or not finite, would take for ever (a request's rois are the client's). A box's bin
      // may span at most twice the input (whose samples past it read as zeros anyway).
      if (p.sampling_ratio == 0 && !(std::fabs(bin_h) <= 2.f * static_cast<float>(p.h + 1) &&
                                     std::fabs(bin_w) <= 2.f * static_cast<float>(p.w + 1))) {
        return InvalidArgument(who + ": roi " + std::to_string(r) +
                               " is not finite, or its bins span more than twice the input (" +
                               std::to_string(p.h) + "x" + std::to_string(p.w) +
                               "), which an adaptive sampling grid cannot sample");
      }
      const int64_t grid_h =
          p.sampling_ratio > 0 ? p.sampling_ratio : static_cast<int64_t>(std::ceil(bin_h));
      const int64_t grid_w =
          p.sampling_ratio > 0 ? p.sampling_ratio : static_cast<int64_t>(std::ceil(bin_w));
      const float count = static_cast<float>(std::max<int64_t>(grid_h * grid_w, 1));
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const float* plane = xs + (batch[r] * p.c + ch) * p.h * p.w;
        float* o = out + (r * p.c + ch) * p.out_h * p.out_w;
        for (int64_t ph = 0; ph < p.out_h; ++ph) {
          for (int64_t pw = 0; pw < p.out_w; ++pw) {
            float acc = 0.f;
            bool first = true;
            for (int64_t iy = 0; iy < grid_h; ++iy) {
              const float y = y1 + static_cast<float>(ph) * bin_h +
                              (static_cast<float>(iy) + 0.5f) * bin_h / static_cast<float>(grid_h);
              for (int64_t ix = 0; ix < grid_w; ++ix) {
                const float xx =
                    x1 + static_cast<float>(pw) * bin_w +
                    (static_cast<float>(ix) + 0.5f) * bin_w / static_cast<float>(grid_w);
                float v[4];
                RoiSample(plane, p.h, p.w, y, xx, v);
                if (p.max) {
                  // As ONNX defines it: the largest weighted corner of any sample.
                  const float m = std::max(std::max(v[0], v[1]), std::max(v[2], v[3]));
                  acc = first ? m : std::max(acc, m);
                  first = false;
                } else {
                  acc += v[0] + v[1] + v[2] + v[3];
                }
              }
            }
            o[ph * p.out_w + pw] = p.max ? acc : acc / count;
          }
        }
      }
    }
    return Status::Ok();
  });
}

Status CheckRoiAlign(const Node& node, const Graph& graph) {
  const std::string who = graph.Describe(&node - graph.nodes.data());
  const std::string mode = node.GetString("mode", "avg");
  if (mode != "avg" && mode != "max")
    return InvalidArgument(who + ": mode '" + mode + "' is not supported");
  const std::string coord = node.GetString("coordinate_transformation_mode", "half_pixel");
  if (coord != "half_pixel" && coord != "output_half_pixel")
    return InvalidArgument(who + ": coordinate_transformation_mode '" + coord +
                           "' is not supported");
  return Status::Ok();
}

// ---- GridSample ----

enum class Padding { kZeros, kBorder, kReflection };

struct GridParams {
  bool nearest = false, cubic = false, align_corners = false;
  Padding padding = Padding::kZeros;
  int64_t n = 0, c = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  int64_t d = 1, out_d = 1;  // volumes (5-D X) only
};

// Reflects `x` into [lo, hi] (repeatedly, as a mirror).
float Reflect(float x, float lo, float hi) {
  if (!std::isfinite(x)) return x;  // outside (InRange)
  if (hi <= lo) return lo;
  const float span = hi - lo;
  const float d = std::fabs(x - lo);
  const float flips = std::floor(d / span);
  const float extra = d - flips * span;
  return std::fmod(flips, 2.f) == 0.f ? lo + extra : hi - extra;
}

// A coordinate an integer index can come from: NaN, infinities and values far outside
// any image become -100, outside (zeros padding reads 0 there), as PyTorch's
// grid_sample treats them. Keeps floor/nearbyint casts to int64_t defined.
float InRange(float x) { return std::fabs(x) <= 1e9f ? x : -100.f; }

// The pixel coordinate of normalised `g` along an axis of `size`.
float Unnormalize(const GridParams& p, float g, int64_t size) {
  const float s = static_cast<float>(size);
  return p.align_corners ? (g + 1.f) / 2.f * (s - 1.f) : ((g + 1.f) * s - 1.f) / 2.f;
}

// `x` after border or reflection padding (unchanged for zeros), then InRange.
float Pad(const GridParams& p, float x, int64_t size) {
  const float s = static_cast<float>(size);
  if (p.padding == Padding::kBorder) {
    x = std::clamp(x, 0.f, s - 1.f);
  } else if (p.padding == Padding::kReflection) {
    x = p.align_corners ? Reflect(x, 0.f, s - 1.f) : Reflect(x, -0.5f, s - 0.5f);
    x = std::clamp(x, 0.f, s - 1.f);
  }
  return InRange(x);
}

// GridSample on volumes: X [N, C, D, H, W] read at grid [N, D_out, H_out, W_out, 3]
// whose last axis is (x, y, z) (along W, H, D), trilinear or nearest, as PyTorch's
// grid_sample on 5-D input.
Status SampleVolume(const GridParams& p, const RunContext& rc) {
  const float* xs = rc.inputs[0]->values<float>().data();
  const float* grid = rc.inputs[1]->values<float>().data();
  float* out = rc.outputs[0]->mutable_values<float>().data();
  const int64_t volume = p.out_d * p.out_h * p.out_w;
  const int64_t in_volume = p.d * p.h * p.w;
  auto at = [&](const float* img, int64_t z, int64_t y, int64_t x) {
    // Zeros padding: outside reads as 0 (border and reflection never get there).
    return z < 0 || z >= p.d || y < 0 || y >= p.h || x < 0 || x >= p.w
               ? 0.f
               : img[(z * p.h + y) * p.w + x];
  };
  for (int64_t b = 0; b < p.n; ++b) {
    for (int64_t i = 0; i < volume; ++i) {
      const float* gp = grid + (b * volume + i) * 3;
      const float sx = Pad(p, Unnormalize(p, gp[0], p.w), p.w);
      const float sy = Pad(p, Unnormalize(p, gp[1], p.h), p.h);
      const float sz = Pad(p, Unnormalize(p, gp[2], p.d), p.d);
      for (int64_t ch = 0; ch < p.c; ++ch) {
        const float* img = xs + (b * p.c + ch) * in_volume;
        float v;
        if (p.nearest) {
          v = at(img, static_cast<int64_t>(std::nearbyint(sz)),
                 static_cast<int64_t>(std::nearbyint(sy)),
                 static_cast<int64_t>(std::nearbyint(sx)));
        } else {
          const float fz = std::floor(sz), fy = std::floor(sy), fx = std::floor(sx);
          const int64_t z0 = static_cast<int64_t>(fz), y0 = static_cast<int64_t>(fy),
                        x0 = static_cast<int64_t>(fx);
          const float lz = sz - fz, ly = sy - fy, lx = sx - fx;
          auto plane = [&](int64_t z) {
            return (1 - ly) * ((1 - lx) * at(img, z, y0, x0) + lx * at(img, z, y0, x0 + 1)) +
                   ly * ((1 - lx) * at(img, z, y0 + 1, x0) + lx * at(img, z, y0 + 1, x0 + 1));
          };
          v = (1 - lz) * plane(z0) + lz * plane(z0 + 1);
        }
        out[(b * p.c + ch) * volume + i] = v;
      }
    }
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PrepareGridSample(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs X and grid");
  RETURN_IF_ERROR(CheckFp32Inputs(ctx));
  const Shape& x = ctx.in_shapes[0];
  const Shape& g = ctx.in_shapes[1];
  const Node& node = ctx.node();
  GridParams p;
  const std::string mode = node.GetString("mode", ctx.opset() >= 20 ? "linear" : "bilinear");
  p.nearest = mode == "nearest";
  p.cubic = mode == "bicubic" || mode == "cubic";
  if (x.size() == 5) {
    if (p.cubic) {
      return ctx.Error("mode '" + mode +
                       "' needs 4-D X [N, C, H, W]; on 5-D X (volumes) only linear and nearest "
                       "are defined (as in PyTorch's grid_sample)");
    }
    if (g.size() != 5 || g[0] != x[0] || g[4] != 3)
      return ctx.Error("grid must be [N, D_out, H_out, W_out, 3] for X " + ShapeToString(x));
  } else if (x.size() != 4) {
    return ctx.Error("X must be 4-D [N, C, H, W] or 5-D [N, C, D, H, W]; was " + ShapeToString(x));
  } else if (g.size() != 4 || g[0] != x[0] || g[3] != 2) {
    return ctx.Error("grid must be [N, H_out, W_out, 2] for X " + ShapeToString(x));
  }
  p.align_corners = node.GetInt("align_corners", 0) != 0;
  const std::string pad = node.GetString("padding_mode", "zeros");
  p.padding = pad == "border"       ? Padding::kBorder
              : pad == "reflection" ? Padding::kReflection
                                    : Padding::kZeros;
  p.n = x[0];
  p.c = x[1];
  ctx.out_dtypes[0] = DataType::kFp32;
  if (x.size() == 5) {
    p.d = x[2];
    p.h = x[3];
    p.w = x[4];
    p.out_d = g[1];
    p.out_h = g[2];
    p.out_w = g[3];
    ctx.out_shapes[0] = Shape{p.n, p.c, p.out_d, p.out_h, p.out_w};
    return MakeFn([p](const RunContext& rc) { return SampleVolume(p, rc); });
  }
  p.h = x[2];
  p.w = x[3];
  p.out_h = g[1];
  p.out_w = g[2];
  ctx.out_shapes[0] = Shape{p.n, p.c, p.out_h, p.out_w};
  return MakeFn([p](const RunContext& rc) -> Status {
    const float* xs = rc.inputs[0]->values<float>().data();
    const float* grid = rc.inputs[1]->values<float>().data();
    // Bicubic: Keys' kernel with a = -0.75 (as PyTorch), each of the 4x4 taps padded
    // on its own.
    auto cubic = [](float t) {
      constexpr float a = -0.75f;
      auto far = [](float d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };
      auto near = [](float d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };
      return std::array<float, 4>{far(t + 1), near(t), near(1 - t), far(2 - t)};
    };
    float* out = rc.outputs[0]->mutable_values<float>().data();
    const int64_t plane = p.out_h * p.out_w;
    auto at = [&](const float* img, int64_t y, int64_t x) {
      // Zeros padding: outside reads as 0 (border and reflection never get there).
      return y < 0 || y >= p.h || x < 0 || x >= p.w ? 0.f : img[y * p.w + x];
    };
    for (int64_t b = 0; b < p.n; ++b) {
      for (int64_t i = 0; i < plane; ++i) {
        const float* gp = grid + (b * plane + i) * 2;
        const float ux = Unnormalize(p, gp[0], p.w), uy = Unnormalize(p, gp[1], p.h);
        const float sx = Pad(p, ux, p.w), sy = Pad(p, uy, p.h);
        // Bicubic taps are padded one by one, from the unpadded coordinate.
        const float cx = InRange(ux), cy = InRange(uy);
        for (int64_t ch = 0; ch < p.c; ++ch) {
          const float* img = xs + (b * p.c + ch) * p.h * p.w;
          float v;
          if (p.cubic) {
            const float fy = std::floor(cy), fx = std::floor(cx);
            const auto wy = cubic(cy - fy), wx = cubic(cx - fx);
            v = 0.f;
            for (int i = 0; i < 4; ++i) {
              const float ty = Pad(p, fy - 1 + static_cast<float>(i), p.h);
              for (int j = 0; j < 4; ++j) {
                const float tx = Pad(p, fx - 1 + static_cast<float>(j), p.w);
                v += wy[i] * wx[j] * at(img, static_cast<int64_t>(ty), static_cast<int64_t>(tx));
              }
            }
          } else if (p.nearest) {
            v = at(img, static_cast<int64_t>(std::nearbyint(sy)),
                   static_cast<int64_t>(std::nearbyint(sx)));
          } else {
            const float fy = std::floor(sy), fx = std::floor(sx);
            const int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
            const float ly = sy - fy, lx = sx - fx;
            v = (1 - ly) * ((1 - lx) * at(img, y0, x0) + lx * at(img, y0, x0 + 1)) +
                ly * ((1 - lx) * at(img, y0 + 1, x0) + lx * at(img, y0 + 1, x0 + 1));
          }
          out[(b * p.c + ch) * plane + i] = v;
        }
      }
    }
    return Status::Ok();
  });
}

Status CheckGridSample(const Node& node, const Graph& graph) {
  const std::string who = graph.Describe(&node - graph.nodes.data());
  const std::string mode = node.GetString("mode", "bilinear");
  if (mode != "bilinear" && mode != "linear" && mode != "nearest" && mode != "bicubic" &&
      mode != "cubic")
    return InvalidArgument(who + ": mode '" + mode + "' is not supported");
  const std::string pad = node.GetString("padding_mode", "zeros");
  if (pad != "zeros" && pad != "border" && pad != "reflection")
    return InvalidArgument(who + ": padding_mode '" + pad + "' is not supported");
  return Status::Ok();
}

}  // namespace

void RegisterSamplingOps(std::vector<OpDef>* ops) {
  ops->push_back({"",
                  "RoiAlign",
                  {"mode", "coordinate_transformation_mode", "output_height", "output_width",
                   "sampling_ratio", "spatial_scale"},
                  CheckRoiAlign,
                  PrepareRoiAlign});
  ops->push_back({"",
                  "GridSample",
                  {"mode", "padding_mode", "align_corners"},
                  CheckGridSample,
                  PrepareGridSample});
}

}  // namespace shoal::engine::internal

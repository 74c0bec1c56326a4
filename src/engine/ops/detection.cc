// Operators whose output shape depends on their input data: NonZero and
// NonMaxSuppression. Their outputs are allocated by the kernel when it runs
// (PrepareContext::out_dynamic); when the inputs are known at plan time the result is
// computed then and becomes a plan constant.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

// Calls fn.template operator()<T>() with T the element type of `t` (bool as uint8_t).
template <typename Fn>
Status DispatchNonZero(DataType t, Fn&& fn) {
  if (t == DataType::kBool) {
    fn.template operator()<uint8_t>();
    return Status::Ok();
  }
  return DispatchNumeric(t, std::forward<Fn>(fn));
}

// ONNX NonZero: the indices of the non-zero elements, [rank, count] in row-major order.
StatusOr<Tensor> NonZero(const Tensor& x) {
  const Shape& shape = x.shape();
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t n = Product(shape);
  std::vector<int64_t> hits;
  Status s = DispatchNonZero(x.dtype(), [&]<typename T>() {
    const T* p = static_cast<const T*>(x.data());
    for (int64_t i = 0; i < n; ++i) {
      if (p[i] != T(0)) hits.push_back(i);
    }
  });
  if (!s.ok()) return s;
  const int64_t count = static_cast<int64_t>(hits.size());
  Tensor out = Tensor::Allocate(DataType::kInt64, Shape{rank, count});
  int64_t* o = out.mutable_values<int64_t>().data();
  for (int64_t j = 0; j < count; ++j) {
    int64_t rest = hits[j];
    for (int64_t d = rank - 1; d >= 0; --d) {
      o[d * count + j] = rest % shape[d];
      rest /= shape[d];
    }
  }
  return out;
}

StatusOr<std::unique_ptr<Kernel>> PrepareNonZero(PrepareContext& ctx) {
  if (ctx.num_inputs() != 1 || !ctx.has_input(0)) return ctx.Error("needs X");
  if (ctx.in_shapes[0].empty()) return ctx.Error("X must have rank 1 or more");
  const DataType dtype = ctx.in_dtypes[0];
  Status ok = DispatchNonZero(dtype, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  ctx.out_dtypes[0] = DataType::kInt64;
  if (ctx.in_data[0] != nullptr) {
    ASSIGN_OR_RETURN(Tensor out, NonZero(*ctx.in_data[0]));
    ctx.out_shapes[0] = out.shape();
    ctx.out_data[0] = std::move(out);
    return std::unique_ptr<Kernel>();
  }
  ctx.out_dynamic[0] = 1;
  return MakeFn([](const RunContext& rc) -> Status {
    ASSIGN_OR_RETURN(*rc.outputs[0], NonZero(*rc.inputs[0]));
    return Status::Ok();
  });
}

// Box corners (y1, x1, y2, x2 ordered so that y1 <= y2, x1 <= x2).
struct Box {
  float y1, x1, y2, x2;
};

Box ReadBox(const float* b, bool center) {
  if (center) {  // [x_center, y_center, width, height]
    const float xc = b[0], yc = b[1], w = b[2], h = b[3];
    return {yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2};
  }
  return {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
}

// Does `a` suppress `b`: intersection over union above `threshold`.
bool Suppresses(const Box& a, const Box& b, float threshold) {
  const float area_a = (a.y2 - a.y1) * (a.x2 - a.x1);
  const float area_b = (b.y2 - b.y1) * (b.x2 - b.x1);
  if (area_a <= 0 || area_b <= 0) return false;
  const float ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  const float iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
  if (ih <= 0 || iw <= 0) return false;
  const float inter = ih * iw;
  return inter / (area_a + area_b - inter) > threshold;
}

struct NmsParams {
  bool center = false;
  int64_t batches = 0, classes = 0, boxes = 0;
};

StatusOr<Tensor> NonMaxSuppression(const NmsParams& p, const std::vector<const Tensor*>& in) {
  int64_t max_out = 0;
  float iou = 0.f, score_min = 0.f;
  bool has_score_min = false;
  if (in.size() > 2 && in[2] && in[2]->element_count() != 0) {
    ASSIGN_OR_RETURN(auto v, ReadInts(*in[2]));
    max_out = v.empty() ? 0 : v[0];
  }
  if (in.size() > 3 && in[3] && in[3]->element_count() != 0) {
    ASSIGN_OR_RETURN(double v, ReadScalar(*in[3]));
    iou = static_cast<float>(v);
  }
  if (in.size() > 4 && in[4] && in[4]->element_count() != 0) {
    ASSIGN_OR_RETURN(double v, ReadScalar(*in[4]));
    score_min = static_cast<float>(v);
    has_score_min = true;
  }
  if (iou < 0.f || iou > 1.f) return InvalidArgument("iou_threshold must lie in [0, 1]");
  const float* boxes = static_cast<const float*>(in[0]->data());
  const float* scores = static_cast<const float*>(in[1]->data());
  std::vector<int64_t> selected;  // triples
  std::vector<int64_t> order;
  std::vector<Box> kept;
  for (int64_t b = 0; b < p.batches && max_out > 0; ++b) {
    std::vector<Box> all(static_cast<size_t>(p.boxes));
    for (int64_t i = 0; i < p.boxes; ++i) all[i] = ReadBox(boxes + (b * p.boxes + i) * 4, p.center);
    for (int64_t c = 0; c < p.classes; ++c) {
      const float* s = scores + (b * p.classes + c) * p.boxes;
      order.clear();
      for (int64_t i = 0; i < p.boxes; ++i) {
        if (!has_score_min || s[i] > score_min) order.push_back(i);
      }
      // Highest score first; equal scores keep the lower box index first.
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      kept.clear();
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool suppressed = false;
        for (const Box& k : kept) {
          if (Suppresses(k, all[i], iou)) {
            suppressed = true;
            break;
          }
        }
        if (suppressed) continue;
        kept.push_back(all[i]);
        selected.insert(selected.end(), {b, c, i});
      }
    }
  }
  const int64_t m = static_cast<int64_t>(selected.size() / 3);
  Tensor out = Tensor::Allocate(DataType::kInt64, Shape{m, 3});
  std::copy(selected.begin(), selected.end(), out.mutable_values<int64_t>().data());
  return out;
}

StatusOr<std::unique_ptr<Kernel>> PrepareNonMaxSuppression(PrepareContext& ctx) {
  if (ctx.num_inputs() < 2 || ctx.num_inputs() > 5 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs boxes and scores");
  if (ctx.in_dtypes[0] != DataType::kFp32 || ctx.in_dtypes[1] != DataType::kFp32)
    return ctx.Error("boxes and scores must be FP32");
  if (ctx.has_input(3) && ctx.in_dtypes[3] != DataType::kFp32)
    return ctx.Error("iou_threshold must be FP32");
  if (ctx.has_input(4) && ctx.in_dtypes[4] != DataType::kFp32)
    return ctx.Error("score_threshold must be FP32");
  if (ctx.has_input(2) && !IsInteger(ctx.in_dtypes[2]))
    return ctx.Error("max_output_boxes_per_class must be an integer");
  const Shape& b = ctx.in_shapes[0];
  const Shape& s = ctx.in_shapes[1];
  if (b.size() != 3 || b[2] != 4) return ctx.Error("boxes must be [batches, boxes, 4]");
  if (s.size() != 3 || s[0] != b[0] || s[2] != b[1])
    return ctx.Error("scores must be [batches, classes, boxes] for boxes " + ShapeToString(b));
  for (size_t i = 2; i < ctx.num_inputs(); ++i) {
    if (ctx.has_input(i) && Product(ctx.in_shapes[i]) > 1)
      return ctx.Error("input " + std::to_string(i) + " must hold at most one value");
  }
  const int64_t center = ctx.node().GetInt("center_point_box", 0);
  if (center != 0 && center != 1) return ctx.Error("center_point_box must be 0 or 1");
  NmsParams p;
  p.center = center == 1;
  p.batches = b[0];
  p.classes = s[1];
  p.boxes = b[1];
  ctx.out_dtypes[0] = DataType::kInt64;
  bool all_known = true;
  std::vector<const Tensor*> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    in.push_back(ctx.in_data[i]);
    if (ctx.has_input(i) && ctx.in_data[i] == nullptr) all_known = false;
  }
  if (all_known) {
    auto out = NonMaxSuppression(p, in);
    if (!out.ok()) return ctx.Error(out.status().message());
    ctx.out_shapes[0] = out->shape();
    ctx.out_data[0] = std::move(*out);
    return std::unique_ptr<Kernel>();
  }
  ctx.out_dynamic[0] = 1;
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([p, who](const RunContext& rc) -> Status {
    auto out = NonMaxSuppression(p, rc.inputs);
    if (!out.ok()) return InvalidArgument(who + ": " + out.status().message());
    *rc.outputs[0] = std::move(*out);
    return Status::Ok();
  });
}

}  // namespace

void RegisterDetectionOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "NonZero", {}, nullptr, PrepareNonZero});
  ops->push_back(
      {"", "NonMaxSuppression", {"center_point_box"}, nullptr, PrepareNonMaxSuppression});
}

}  // namespace shoal::engine::internal

// SplitForGpu (gpu_lowering.h): a model cut into a GPU stage and a CPU tail. Host only,
// runs everywhere: the stages are checked by running both on the CPU engine, one after the
// other, against the model's reference outputs. The GPU instance that runs the stage on a
// device is tested in backends/onnx (OnnxBackendGpuTest).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/model.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AInt;
using engine::testing::GraphBuilder;
using engine::testing::LoadReference;
using engine::testing::ModelPath;
using engine::testing::Reference;
using ::testing::HasSubstr;

std::vector<Shape> ShapesOf(const std::vector<NamedTensor>& tensors) {
  std::vector<Shape> shapes;
  for (const NamedTensor& t : tensors) shapes.push_back(t.tensor.shape());
  return shapes;
}

// The two stages, run on the CPU engine as a GPU instance chains them: the stage on the
// model's inputs it reads, the tail on the stage's outputs and the model's inputs it reads.
std::vector<NamedTensor> RunStages(const GpuCpuSplit& split,
                                   const std::vector<NamedTensor>& inputs) {
  std::vector<NamedTensor> out;
  auto first = Session::Create(*split.gpu_stage);
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  if (!first.ok()) return out;
  std::vector<NamedTensor> first_in, staged = inputs;
  for (int v : split.gpu_stage->graph().inputs)
    for (const NamedTensor& t : inputs)
      if (t.name == split.gpu_stage->graph().values[v].name) first_in.push_back(t);
  std::vector<NamedTensor> first_out;
  const Status ran = (*first)->Run(first_in, &first_out);
  EXPECT_TRUE(ran.ok()) << ran.ToString();
  staged.insert(staged.end(), first_out.begin(), first_out.end());
  auto tail = Session::Create(*split.cpu_tail);
  EXPECT_TRUE(tail.ok()) << tail.status().ToString();
  if (!tail.ok()) return out;
  std::vector<NamedTensor> tail_in;
  for (int v : split.cpu_tail->graph().inputs)
    for (const NamedTensor& t : staged)
      if (t.name == split.cpu_tail->graph().values[v].name) tail_in.push_back(t);
  std::vector<NamedTensor> tail_out;
  const Status finished = (*tail)->Run(tail_in, &tail_out);
  EXPECT_TRUE(finished.ok()) << finished.ToString();
  // The model's outputs from either stage.
  for (const NamedTensor& t : tail_out) out.push_back(t);
  for (const NamedTensor& t : first_out) out.push_back(t);
  return out;
}

// The smallest shapes of `model`'s inputs (symbolic dimensions 1).
std::vector<Shape> Smallest(const Model& model) {
  std::vector<Shape> shapes;
  for (const TensorInfo& t : model.inputs()) {
    Shape shape;
    for (const auto& d : t.shape) shape.push_back(d.known() ? d.value : 1);
    shapes.push_back(shape);
  }
  return shapes;
}

// Detection models end in what the GPU path lacks (NonMaxSuppression, NonZero and the shapes
// they make, a Loop or an If over the detections): their backbones run on the GPU, the rest
// on the CPU, and the two stages together answer as the model does.
TEST(SplitForGpuTest, ADetectorsBackboneGoesToTheGpuAndItsNmsToTheCpu) {
  for (const char* name : {"det_detector_op13", "det_detector_batched_op17", "cf_detect_op13",
                           "det_tensor_ops_op17"}) {
    SCOPED_TRACE(name);
    auto model = Model::Load(ModelPath(std::string(name) + ".onnx"));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const Reference ref = LoadReference(std::string(name) + ".a.sht");
    ASSERT_FALSE(ref.inputs.empty());
    // Cut where an instance cuts it, at the smallest shapes; run at the reference's.
    auto split = SplitForGpu(**model, Smallest(**model));
    ASSERT_TRUE(split.ok()) << split.status().ToString();
    EXPECT_GT(split->cut, 0);
    EXPECT_LT(split->cut, static_cast<int>((*model)->graph().nodes.size()));
    ASSERT_FALSE(split->cpu_nodes.empty());
    EXPECT_EQ(split->gpu_stage->graph().nodes.size(), static_cast<size_t>(split->cut));
    EXPECT_EQ(split->cpu_tail->graph().nodes.size() + split->cut, (*model)->graph().nodes.size());
    // The first node refused is the tail's first.
    EXPECT_THAT(split->cpu_nodes[0], HasSubstr((*model)->graph().nodes[split->cut].op_type));
    // Both stages on the CPU, one after the other, give the model's reference outputs.
    const std::vector<NamedTensor> out = RunStages(*split, ref.inputs);
    for (const NamedTensor& want : ref.outputs) {
      const NamedTensor* got = nullptr;
      for (const NamedTensor& t : out)
        if (t.name == want.name) got = &t;
      ASSERT_NE(got, nullptr) << want.name;
      ASSERT_EQ(got->tensor.shape(), want.tensor.shape()) << want.name;
      ASSERT_EQ(got->tensor.dtype(), want.tensor.dtype()) << want.name;
      if (want.tensor.dtype() == DataType::kFp32) {
        EXPECT_LE(engine::testing::MaxAbsDiff(got->tensor, want.tensor),
                  1e-4f * std::max(1.f, engine::testing::MaxAbs(want.tensor)))
            << want.name;
      } else {
        EXPECT_EQ(got->tensor.bytes(), want.tensor.bytes()) << want.name;
      }
    }
  }
}

// A control-flow model: its Relu runs on the GPU, its If and what follows on the CPU.
TEST(SplitForGpuTest, AnIfAndWhatFollowsGoToTheCpu) {
  auto cf = Model::Load(ModelPath("cf_graph_if.onnx"));
  ASSERT_TRUE(cf.ok()) << cf.status().ToString();
  auto split = SplitForGpu(**cf, Smallest(**cf));
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  EXPECT_EQ((*cf)->graph().nodes[split->cut].op_type, "If");
  EXPECT_THAT(split->cpu_nodes[0], HasSubstr("(If)"));
  EXPECT_EQ(split->gpu_stage->graph().nodes.size(), static_cast<size_t>(split->cut));
}

// A model whose first node the GPU path refuses would run nothing there; one whose cut
// cannot be made (the NMS model's shapes, probed at two batch sizes, no longer agree)
// fails with the reason. Either way the instance is refused, saying why.
TEST(SplitForGpuTest, NothingForTheGpuOrNoCutIsAnError) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3});
  const int nz = b.Op("NonZero", "nz", {x});
  auto first = Model::FromGraph(b.Finish(b.Op("Cast", "f", {nz}, {{"to", AInt(1)}})));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto split = SplitForGpu(**first, {{2, 3}});
  EXPECT_EQ(split.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(split.status().message(), HasSubstr("first node"));
  EXPECT_THAT(split.status().message(), HasSubstr("(NonZero)"));
  auto nms = Model::Load(ModelPath("det_nms_topk_op13.onnx"));
  ASSERT_TRUE(nms.ok()) << nms.status().ToString();
  const Reference ref = LoadReference("det_nms_topk_op13.a.sht");
  split = SplitForGpu(**nms, ShapesOf(ref.inputs));
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument) << split.status().ToString();
  EXPECT_THAT(split.status().message(), HasSubstr("cutting the model before"));
  EXPECT_THAT(split.status().message(), HasSubstr("NonMaxSuppression"));
}

// A model the GPU path runs whole needs no tail.
TEST(SplitForGpuTest, AModelThatLowersWholeNeedsNoTail) {
  auto model = Model::Load(Example("recommender"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto split = SplitForGpu(**model, {{4, 64}});
  EXPECT_EQ(split.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(split.status().message(), HasSubstr("needs no CPU tail"));
}

}  // namespace
}  // namespace shoal::engine::cuda

// Detection and segmentation operators as PyTorch exports them: the committed models of
// models/generate_detection.py (operator families, a small detector with NMS
// post-processing, a segmentation U-Net; one hand-built opset-18 graph for what PyTorch
// never exports) against PyTorch's outputs. Each model has two references with different
// inputs (and sizes, where an axis is dynamic), some a third where NonZero selects
// nothing; data-dependent integer outputs (NMS indices, nonzero, labels) must match
// exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;

// The operator types of a model's graph after loading.
std::set<std::string> OpTypes(const Model& model) {
  std::set<std::string> ops;
  for (const Node& n : model.graph().nodes) ops.insert(n.op_type);
  return ops;
}

struct DetectionModel {
  std::string name;
  // Operators the export must hold (so a change in the exporter cannot silently leave a
  // family untested).
  std::vector<std::string> ops;
  // A third reference, .empty.sht, where NonZero selects nothing (zero-length outputs).
  bool empty_case = false;
};

void PrintTo(const DetectionModel& m, std::ostream* os) { *os << m.name; }

class DetectionModelTest : public ::testing::TestWithParam<DetectionModel> {};

TEST_P(DetectionModelTest, MatchesPyTorch) {
  const DetectionModel& param = GetParam();
  auto model = Model::Load(ModelPath(param.name + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::set<std::string> ops = OpTypes(**model);
  for (const std::string& op : param.ops) EXPECT_TRUE(ops.count(op)) << "no " << op << " node";
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the cached plans
    std::vector<std::string> refs = {".a.sht", ".b.sht"};
    if (param.empty_case) refs.push_back(".empty.sht");
    for (const std::string& ref : refs) {
      SCOPED_TRACE(param.name + ref);
      ExpectMatchesReference(**session, LoadReference(param.name + ref));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, DetectionModelTest,
    ::testing::Values(
        DetectionModel{"det_nms_topk_op13", {"NonMaxSuppression", "TopK"}},
        DetectionModel{"det_nms_topk_op17", {"NonMaxSuppression", "TopK"}},
        DetectionModel{"det_roi_align_op13", {"RoiAlign"}},
        DetectionModel{"det_roi_align_aligned_op17", {"RoiAlign"}},
        DetectionModel{"det_resize_op13", {"Resize"}},
        DetectionModel{"det_resize_op17", {"Resize"}},
        DetectionModel{"det_grid_sample_op17", {"GridSample"}},
        DetectionModel{"det_scatter_gather_unique_op13",
                       {"ScatterND", "ScatterElements", "GatherND", "NonZero", "GatherElements"},
                       true},
        DetectionModel{"det_scatter_gather_op17",
                       {"ScatterND", "ScatterElements", "GatherND", "NonZero", "GatherElements"},
                       true},
        DetectionModel{"det_tensor_ops_op17", {"CumSum", "Range", "NonZero", "Trilu", "Mod"}, true},
        DetectionModel{"det_norm_shuffle_op13", {"DepthToSpace", "InstanceNormalization", "Mod"}},
        DetectionModel{"det_norm_shuffle_op17", {"DepthToSpace", "InstanceNormalization", "Mod"}},
        DetectionModel{"det_detector_op13", {"NonMaxSuppression", "TopK", "NonZero", "Conv"}},
        DetectionModel{"det_detector_op17", {"NonMaxSuppression", "TopK", "NonZero", "Conv"}},
        DetectionModel{"det_graph_layout_norm",
                       {"SpaceToDepth", "DepthToSpace", "GroupNormalization"}},
        DetectionModel{"det_unet_op13",
                       {"ConvTranspose", "Resize", "InstanceNormalization", "ArgMax"}},
        DetectionModel{"det_unet_op17",
                       {"ConvTranspose", "Resize", "InstanceNormalization", "ArgMax"}}),
    [](const auto& info) { return info.param.name; });

// topk(5) over the n boxes prepares only when n >= 5: the load probes again at larger
// values of n, and still names the symbolic dimensions of the outputs.
TEST(ModelLoadTest, TopKWithAConstantKOverADynamicAxis) {
  auto model = Model::Load(ModelPath("det_nms_topk_op17.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ASSERT_EQ((*model)->inputs().size(), 3u);
  EXPECT_EQ(SymbolicShapeToString((*model)->inputs()[0].shape), "[n,4]");
  std::map<std::string, std::string> shapes;
  for (const auto& out : (*model)->outputs()) shapes[out.name] = SymbolicShapeToString(out.shape);
  EXPECT_EQ(shapes["top_values"], "[5]");
  EXPECT_EQ(shapes["top_indices"], "[5]");
  EXPECT_EQ(shapes["row_values"], "[n,2]");
}

// torchvision.ops.batched_nms as PyTorch exports it: its scripted guard for empty input
// becomes an If node with NonMaxSuppression in the else branch. Same weights and
// references as det_detector_op17. Until the engine runs If (issue 21's control flow),
// the load fails on that node and the test is skipped, saying so.
TEST(DetectorTest, TorchvisionBatchedNmsWithItsIfNode) {
  auto model = Model::Load(ModelPath("det_detector_batched_op17.onnx"));
  if (!model.ok() &&
      model.status().message().find("operator 'If' is not supported") != std::string::npos)
    GTEST_SKIP() << model.status().ToString();
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (const char* ref : {".a.sht", ".b.sht"}) {
    SCOPED_TRACE(ref);
    ExpectMatchesReference(**session,
                           LoadReference(std::string("det_detector_batched_op17") + ref));
  }
}

// The detector's references differ in how many boxes survive NMS: the output's length is
// learned at run time, in one session, in either order.
TEST(DetectorTest, DetectionCountFollowsTheImage) {
  auto model = Model::Load(ModelPath("det_detector_op17.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  const Reference a = LoadReference("det_detector_op17.a.sht");
  const Reference b = LoadReference("det_detector_op17.b.sht");
  ASSERT_EQ(a.outputs.size(), 3u);
  ASSERT_EQ(b.outputs.size(), 3u);
  ASSERT_NE(a.outputs[0].tensor.shape(), b.outputs[0].tensor.shape());
  for (const Reference* ref : {&b, &a, &b}) ExpectMatchesReference(**session, *ref);
  EXPECT_EQ((*session)->cached_plans(), 1);
}

}  // namespace
}  // namespace shoal::engine

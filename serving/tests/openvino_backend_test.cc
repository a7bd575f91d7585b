// OpenVINO backend against a small real model: the digits network with seeded
// random weights, written into the build tree by the ctest fixture
// `openvino_test_model` (tests/make_test_model.py) in the legacy Paddle format
// and as OpenVINO IR, with the dygraph model's logits for a few inputs. Run it
// through ctest (which runs the fixture first); without the model every test
// here fails.
#include "openvino_backend.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "signature.h"

namespace serving {
namespace {

const std::string kModelDir = SERVING_TEST_MODEL_DIR;

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

class OpenVinoBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Exists(kModelDir + "/signature.json"))
        << "no test model in " << kModelDir
        << ": the ctest fixture openvino_test_model writes it (run these tests "
           "with `ctest --test-dir build/serving`, configured with "
           "-DPython3_EXECUTABLE=<the project's .venv/bin/python>)";
    auto sig = ModelSignature::Load(kModelDir + "/signature.json");
    ASSERT_TRUE(sig.ok()) << sig.status().ToString();
    sig_ = *sig;
    const std::string key = GetParam();
    ASSERT_TRUE(sig_.formats.count(key))
        << kModelDir << "/signature.json has no format " << key;
    options_.model_path = kModelDir + "/" + sig_.formats[key].program;
    options_.runtime_input_names = sig_.formats[key].input_names;
    options_.runtime_output_names = sig_.formats[key].output_names;
    options_.inputs = sig_.inputs;
    options_.outputs = sig_.outputs;
    options_.instances = 2;
    options_.threads_per_instance = 1;
    options_.max_batch_size = 16;
  }

  Tensor RandomInput(int64_t batch, uint32_t seed) {
    Shape shape = sig_.inputs[0].shape;
    shape[0] = batch;
    Tensor t = Tensor::Allocate(sig_.inputs[0].name, DataType::kFp32, shape);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < t.element_count(); ++i)
      t.data_as<float>()[i] = dist(rng);
    return t;
  }

  ModelSignature sig_;
  BackendOptions options_;
};

TEST_P(OpenVinoBackendTest, MatchesThePaddleModelsLogits) {
  std::ifstream in(kModelDir + "/reference.json");
  ASSERT_TRUE(in) << "cannot read " << kModelDir << "/reference.json";
  const auto reference = nlohmann::json::parse(in);
  const auto& ref_in = reference.at("input");
  const auto& ref_out = reference.at("output");
  const Shape shape = ref_in.at("shape").get<Shape>();
  const auto x = ref_in.at("data").get<std::vector<float>>();
  const auto expected = ref_out.at("data").get<std::vector<float>>();
  Tensor batch = Tensor::Allocate(sig_.inputs[0].name, DataType::kFp32, shape);
  ASSERT_EQ(static_cast<size_t>(batch.element_count()), x.size());
  std::copy(x.begin(), x.end(), batch.data_as<float>());

  auto backend = OpenVinoBackend::Create(options_);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  for (size_t instance = 0; instance < 2; ++instance) {
    std::vector<Tensor> outputs;
    const Status status = (*backend)->Infer(instance, {batch}, &outputs);
    ASSERT_TRUE(status.ok()) << status.ToString();
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0].shape, ref_out.at("shape").get<Shape>());
    ASSERT_EQ(static_cast<size_t>(outputs[0].element_count()), expected.size());
    // The export step's parity bound: |got - paddle| <= 1e-4 + 1e-3 |paddle|.
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(outputs[0].data_as<float>()[i], expected[i],
                  1e-4 + 1e-3 * std::fabs(expected[i]))
          << "logit " << i << " on instance " << instance;
    }
  }
}

TEST_P(OpenVinoBackendTest, RunsAnyBatchSizeAndBatchingDoesNotChangeResults) {
  auto backend = OpenVinoBackend::Create(options_);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_EQ((*backend)->InstanceCount(), 2u);

  Tensor batch = RandomInput(5, 7);
  std::vector<Tensor> outputs;
  ASSERT_TRUE((*backend)->Infer(0, {batch}, &outputs).ok());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, sig_.outputs[0].name);
  ASSERT_EQ(outputs[0].shape.size(), 2u);
  EXPECT_EQ(outputs[0].shape[0], 5);
  const int64_t classes = outputs[0].shape[1];
  const int64_t per_sample = batch.element_count() / 5;

  // Each sample alone (on the other instance) gives the same logits.
  for (int64_t i = 0; i < 5; ++i) {
    Shape shape = batch.shape;
    shape[0] = 1;
    Tensor one = Tensor::Allocate(batch.name, DataType::kFp32, shape);
    std::copy(batch.data_as<float>() + i * per_sample,
              batch.data_as<float>() + (i + 1) * per_sample,
              one.data_as<float>());
    std::vector<Tensor> single;
    ASSERT_TRUE((*backend)->Infer(1, {one}, &single).ok());
    for (int64_t c = 0; c < classes; ++c) {
      EXPECT_NEAR(single[0].data_as<float>()[c],
                  outputs[0].data_as<float>()[i * classes + c], 1e-4);
    }
  }
}

TEST_P(OpenVinoBackendTest, RejectsAMismatchedSignature) {
  options_.inputs[0].shape = {-1, 3, 28, 28};
  auto backend = OpenVinoBackend::Create(options_);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("signature.json"),
            std::string::npos)
      << backend.status().message();
}

INSTANTIATE_TEST_SUITE_P(Formats, OpenVinoBackendTest,
                         ::testing::Values("legacy", "ir"));

TEST(OpenVinoBackendErrors, MissingFileIsAReadableError) {
  BackendOptions options;
  options.model_path = "/nonexistent/model.xml";
  options.inputs = {{"x", DataType::kFp32, {-1, 2}}};
  options.outputs = {{"y", DataType::kFp32, {-1, 2}}};
  auto backend = OpenVinoBackend::Create(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("cannot read"), std::string::npos);
}

}  // namespace
}  // namespace serving

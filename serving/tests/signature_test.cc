#include "signature.h"

#include <gtest/gtest.h>

namespace serving {
namespace {

constexpr char kSignature[] = R"({
  "formats": {
    "int8_openvino": {"params": "int8/openvino/model.bin", "program": "int8/openvino/model.xml"},
    "legacy": {"input_names": ["image"], "output_names": ["linear_2.tmp_1"],
               "params": "legacy/model.pdiparams", "program": "legacy/model.pdmodel"}
  },
  "inputs": [{"dtype": "float32", "name": "image", "shape": [-1, 1, 28, 28]}],
  "outputs": [{"dtype": "float32", "name": "logits", "shape": [-1, 10]}],
  "label_names": ["0","1","2","3","4","5","6","7","8","9"],
  "task": "digits"
})";

TEST(SignatureTest, ParsesExportedSignature) {
  auto sig = ModelSignature::Parse(kSignature);
  ASSERT_TRUE(sig.ok()) << sig.status().ToString();
  EXPECT_EQ(sig->task, "digits");
  ASSERT_EQ(sig->inputs.size(), 1u);
  EXPECT_EQ(sig->inputs[0].name, "image");
  EXPECT_EQ(sig->inputs[0].dtype, DataType::kFp32);
  EXPECT_EQ(sig->inputs[0].shape, (Shape{-1, 1, 28, 28}));
  EXPECT_EQ(sig->outputs[0].name, "logits");
  EXPECT_EQ(sig->label_names.size(), 10u);
  EXPECT_EQ(sig->formats.at("legacy").program, "legacy/model.pdmodel");
  EXPECT_EQ(sig->formats.at("legacy").output_names,
            (std::vector<std::string>{"linear_2.tmp_1"}));
  EXPECT_EQ(sig->formats.at("int8_openvino").program,
            "int8/openvino/model.xml");
}

TEST(SignatureTest, RejectsBrokenSignatures) {
  EXPECT_FALSE(ModelSignature::Parse("{").ok());
  EXPECT_FALSE(ModelSignature::Parse("[]").ok());
  EXPECT_FALSE(ModelSignature::Parse(R"({"inputs": [], "outputs": []})").ok());
  auto bad_dtype = ModelSignature::Parse(
      R"({"inputs": [{"name": "x", "shape": [-1], "dtype": "complex64"}],
          "outputs": [{"name": "y", "shape": [-1]}]})");
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_NE(bad_dtype.status().message().find("unknown dtype 'complex64'"),
            std::string::npos);
  EXPECT_EQ(ModelSignature::Load("/nonexistent/signature.json").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace serving

#include "codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

namespace serving {
namespace {

using json = nlohmann::json;

ModelIO DigitsIO() {
  ModelIO io;
  io.inputs = {{"image", DataType::kFp32, {-1, 1, 2, 2}}};
  io.outputs = {{"logits", DataType::kFp32, {-1, 3}}};
  io.max_batch_size = 4;
  io.labels = {"zero", "one", "two"};
  return io;
}

std::string FloatBytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<float> Floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.element_count());
}

Status ParseError(const std::string& body,
                  std::optional<size_t> json_length = std::nullopt) {
  auto r = ParseInferRequest(body, json_length, DigitsIO());
  return r.ok() ? Status::Ok() : r.status();
}

void ExpectInvalid(const std::string& body, const std::string& fragment,
                   std::optional<size_t> json_length = std::nullopt) {
  Status s = ParseError(body, json_length);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << body;
  EXPECT_NE(s.message().find(fragment), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << fragment;
}

TEST(CodecTest, ParsesFlatJsonData) {
  const std::string body =
      R"({"id":"r1","inputs":[{"name":"image","shape":[1,1,2,2],
      "datatype":"FP32","data":[1,2.5,-3,4]}]})";
  auto req = ParseInferRequest(body, std::nullopt, DigitsIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->id.value_or(""), "r1");
  EXPECT_EQ(req->batch_size, 1);
  ASSERT_EQ(req->inputs.size(), 1u);
  EXPECT_EQ(req->inputs[0].shape, (Shape{1, 1, 2, 2}));
  EXPECT_EQ(Floats(req->inputs[0]), (std::vector<float>{1, 2.5f, -3, 4}));
  // No outputs requested: all of them, as JSON.
  ASSERT_EQ(req->outputs.size(), 1u);
  EXPECT_EQ(req->outputs[0].name, "logits");
  EXPECT_FALSE(req->outputs[0].binary);
}

TEST(CodecTest, ParsesNestedJsonData) {
  const std::string body = R"({"inputs":[{"name":"image","shape":[2,1,2,2],
      "datatype":"FP32","data":[[[[1,2],[3,4]]],[[[5,6],[7,8]]]]}]})";
  auto req = ParseInferRequest(body, std::nullopt, DigitsIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->batch_size, 2);
  EXPECT_EQ(Floats(req->inputs[0]),
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(CodecTest, RejectsMalformedRequests) {
  ExpectInvalid("{not json", "malformed JSON");
  ExpectInvalid("[1,2]", "must be a JSON object");
  ExpectInvalid("", "empty inference request");
  ExpectInvalid(R"({"outputs":[]})", "'inputs' array");
  ExpectInvalid(
      R"({"inputs":[{"name":"pixels","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
      "unexpected input 'pixels'; the model expects 'image'");
  ExpectInvalid(R"({"inputs":[]})", "missing input 'image'");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"INT32","data":[1,2,3,4]}]})",
      "datatype INT32 is not supported, the model expects FP32");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FLOAT","data":[1,2,3,4]}]})",
      "unknown datatype 'FLOAT'");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
      "rank 3 vs 4");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,3],"datatype":"FP32","data":[1,2,3,4,5,6]}]})",
      "at dim 3");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,-2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
      "non-negative integers");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[0,1,2,2],"datatype":"FP32","data":[]}]})",
      "at least 1");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,"x",3,4]}]})",
      "element 1 (\"x\") is not a valid FP32 value");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32"}]})",
      "neither 'data' nor 'binary_data_size'");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]},
                              {"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]}]})",
      "more than once");
  ExpectInvalid(R"({"id":7,"inputs":[]})", "'id' must be a string");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32",
      "parameters":{"shared_memory_region":"r"}}]})",
      "shared memory extension is not supported");
}

TEST(CodecTest, RejectsDataLengthMismatch) {
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3]}]})",
      "'data' has 3 elements but shape [1,1,2,2] needs 4");
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4,5]}]})",
      "more than 4 elements");
}

TEST(CodecTest, RejectsBatchOverMax) {
  std::string data = "[";
  for (int i = 0; i < 20; ++i)
    data += (i ? ",0" : "0");
  data += "]";
  ExpectInvalid(
      R"({"inputs":[{"name":"image","shape":[5,1,2,2],"datatype":"FP32","data":)" +
          data + "}]}",
      "batch size 5 exceeds the max batch size 4");
}

TEST(CodecTest, ValidatesRequestedOutputs) {
  const std::string in =
      R"({"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4]})";
  ExpectInvalid(R"({"inputs":[)" + in + R"(],"outputs":[{"name":"probs"}]})",
                "unknown output 'probs'; the model has 'logits'");
  ExpectInvalid(
      R"({"inputs":[)" + in +
          R"(],"outputs":[{"name":"logits","parameters":{"binary_data":"yes"}}]})",
      "'binary_data' must be a boolean");
  ExpectInvalid(
      R"({"inputs":[)" + in +
          R"(],"outputs":[{"name":"logits","parameters":{"classification":0}}]})",
      "'classification' must be >= 1");
  auto req = ParseInferRequest(
      R"({"inputs":[)" + in +
          R"(],"parameters":{"binary_data_output":true,"timeout":1500,"custom":"x"}})",
      std::nullopt, DigitsIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_TRUE(req->outputs[0].binary);
  EXPECT_EQ(req->timeout_us, 1500);
  // A per-output binary_data overrides binary_data_output.
  req = ParseInferRequest(R"({"inputs":[)" + in +
                              R"(],"parameters":{"binary_data_output":true},
             "outputs":[{"name":"logits","parameters":{"binary_data":false}}]})",
                          std::nullopt, DigitsIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_FALSE(req->outputs[0].binary);
}

TEST(CodecTest, ParsesBinaryTensorData) {
  const std::string header =
      R"({"inputs":[{"name":"image","shape":[2,1,2,2],"datatype":"FP32","parameters":{"binary_data_size":32}}],
          "outputs":[{"name":"logits","parameters":{"binary_data":true}}]})";
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string body = header + FloatBytes(values);
  auto length =
      ParseInferenceHeaderLength(std::to_string(header.size()), body.size());
  ASSERT_TRUE(length.ok());
  auto req = ParseInferRequest(body, *length, DigitsIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->batch_size, 2);
  EXPECT_EQ(Floats(req->inputs[0]), values);
  EXPECT_TRUE(req->outputs[0].binary);
}

TEST(CodecTest, BinaryOffsetsFollowInputOrder) {
  ModelIO io;
  io.inputs = {{"a", DataType::kFp32, {-1, 2}},
               {"b", DataType::kFp32, {-1, 1}}};
  io.outputs = {{"y", DataType::kFp32, {-1, 1}}};
  io.max_batch_size = 8;
  // "b" is listed first, so its bytes come first; "a" is JSON.
  const std::string header =
      R"({"inputs":[{"name":"b","shape":[2,1],"datatype":"FP32","parameters":{"binary_data_size":8}},
                    {"name":"a","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]})";
  const std::string body = header + FloatBytes({9, 10});
  auto req = ParseInferRequest(body, header.size(), io);
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->inputs[0].name, "a");  // model order
  EXPECT_EQ(Floats(req->inputs[0]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Floats(req->inputs[1]), (std::vector<float>{9, 10}));

  // Both binary: offsets accumulate in listed order.
  const std::string header2 =
      R"({"inputs":[{"name":"a","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}},
                    {"name":"b","shape":[1,1],"datatype":"FP32","parameters":{"binary_data_size":4}}]})";
  auto req2 =
      ParseInferRequest(header2 + FloatBytes({1, 2, 3}), header2.size(), io);
  ASSERT_TRUE(req2.ok()) << req2.status().ToString();
  EXPECT_EQ(Floats(req2->inputs[0]), (std::vector<float>{1, 2}));
  EXPECT_EQ(Floats(req2->inputs[1]), (std::vector<float>{3}));

  // Different batch sizes across inputs are rejected.
  const std::string header3 =
      R"({"inputs":[{"name":"a","shape":[1,2],"datatype":"FP32","data":[1,2]},
                    {"name":"b","shape":[2,1],"datatype":"FP32","data":[1,2]}]})";
  auto req3 = ParseInferRequest(header3, std::nullopt, io);
  EXPECT_EQ(req3.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(req3.status().message().find("disagree on the batch size"),
            std::string::npos);
}

TEST(CodecTest, RejectsBadBinaryFraming) {
  const std::string header =
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","parameters":{"binary_data_size":16}}]})";
  const std::string data = FloatBytes({1, 2, 3, 4});
  // Truncated body.
  ExpectInvalid(header + data.substr(0, 10), "request body is truncated",
                header.size());
  // Extra bytes nobody claims.
  ExpectInvalid(header + data + "xx", "2 bytes after the JSON header",
                header.size());
  // binary_data_size disagreeing with the shape.
  const std::string wrong_size =
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","parameters":{"binary_data_size":12}}]})";
  ExpectInvalid(
      wrong_size + data.substr(0, 12),
      "binary_data_size 12 does not match shape [1,1,2,2] of FP32 (16 bytes)",
      wrong_size.size());
  // Binary data without the header.
  ExpectInvalid(header + data, "needs the Inference-Header-Content-Length");
  ExpectInvalid(R"({"inputs":[]})" + std::string("\0junk", 5),
                "needs the Inference-Header-Content-Length");
  // data and binary_data_size together.
  const std::string both =
      R"({"inputs":[{"name":"image","shape":[1,1,2,2],"datatype":"FP32","data":[1,2,3,4],"parameters":{"binary_data_size":16}}]})";
  ExpectInvalid(both + data, "both 'data' and 'binary_data_size'", both.size());
}

TEST(CodecTest, ParsesInferenceHeaderLength) {
  EXPECT_EQ(*ParseInferenceHeaderLength("12", 20), 12u);
  EXPECT_EQ(*ParseInferenceHeaderLength(" 20 ", 20), 20u);
  EXPECT_FALSE(ParseInferenceHeaderLength("21", 20).ok());
  EXPECT_FALSE(ParseInferenceHeaderLength("-1", 20).ok());
  EXPECT_FALSE(ParseInferenceHeaderLength("abc", 20).ok());
  EXPECT_FALSE(ParseInferenceHeaderLength("", 20).ok());
  EXPECT_FALSE(ParseInferenceHeaderLength("12x", 20).ok());
}

InferRequest RequestFor(bool binary, int64_t classification = 0) {
  InferRequest req;
  req.id = "abc";
  req.batch_size = 2;
  req.outputs = {{"logits", 0, binary, classification}};
  return req;
}

std::vector<Tensor> Logits() {
  Tensor t = Tensor::Allocate("logits", DataType::kFp32, {2, 3});
  const float values[] = {0.1f, 2.0f, -1.5f, 3.25f, 1e-8f, 7.0f};
  std::memcpy(t.data.data(), values, sizeof(values));
  return {t};
}

TEST(CodecTest, EncodesJsonResponse) {
  auto encoded = EncodeInferResponse("digits-classifier", "1",
                                     RequestFor(false), Logits(), DigitsIO());
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  EXPECT_FALSE(encoded->json_length.has_value());
  EXPECT_EQ(encoded->content_type, "application/json");
  const json body = json::parse(encoded->body);
  EXPECT_EQ(body["model_name"], "digits-classifier");
  EXPECT_EQ(body["model_version"], "1");
  EXPECT_EQ(body["id"], "abc");
  const json& out = body["outputs"][0];
  EXPECT_EQ(out["name"], "logits");
  EXPECT_EQ(out["datatype"], "FP32");
  EXPECT_EQ(out["shape"], json({2, 3}));
  ASSERT_EQ(out["data"].size(), 6u);
  // Shortest round-trip text: parses back to the same float.
  const float expected[] = {0.1f, 2.0f, -1.5f, 3.25f, 1e-8f, 7.0f};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(out["data"][i].get<float>(), expected[i]);
  }
  EXPECT_NE(encoded->body.find("0.1,"), std::string::npos);
}

TEST(CodecTest, EncodesBinaryResponse) {
  auto encoded =
      EncodeInferResponse("m", "1", RequestFor(true), Logits(), DigitsIO());
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  ASSERT_TRUE(encoded->json_length.has_value());
  EXPECT_EQ(encoded->content_type, "application/octet-stream");
  const size_t n = *encoded->json_length;
  ASSERT_EQ(encoded->body.size(), n + 24);
  const json header = json::parse(encoded->body.substr(0, n));
  const json& out = header["outputs"][0];
  EXPECT_EQ(out["parameters"]["binary_data_size"], 24);
  EXPECT_FALSE(out.contains("data"));
  const std::vector<Tensor> logits = Logits();
  EXPECT_EQ(encoded->body.substr(n),
            std::string(logits[0].data.begin(), logits[0].data.end()));
}

TEST(CodecTest, EncodesClassification) {
  auto encoded =
      EncodeInferResponse("m", "1", RequestFor(false, 2), Logits(), DigitsIO());
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  const json out = json::parse(encoded->body)["outputs"][0];
  EXPECT_EQ(out["datatype"], "BYTES");
  EXPECT_EQ(out["shape"], json({2, 2}));
  EXPECT_EQ(out["data"],
            json({"2:1:one", "0.1:0:zero", "7:2:two", "3.25:0:zero"}));

  auto binary =
      EncodeInferResponse("m", "1", RequestFor(true, 1), Logits(), DigitsIO());
  ASSERT_TRUE(binary.ok());
  const size_t n = *binary->json_length;
  const std::string payload = binary->body.substr(n);
  // Each element: 4-byte little-endian length, then the bytes.
  ASSERT_EQ(payload.size(), 4 + 7 + 4 + 7u);
  uint32_t len = 0;
  std::memcpy(&len, payload.data(), 4);
  EXPECT_EQ(len, 7u);
  EXPECT_EQ(payload.substr(4, 7), "2:1:one");
  EXPECT_EQ(payload.substr(15, 7), "7:2:two");
}

TEST(CodecTest, FormatsFloatsAndErrors) {
  EXPECT_EQ(FormatFloat(0.5f), "0.5");
  EXPECT_EQ(FormatFloat(3.0f), "3");
  EXPECT_EQ(FormatFloat(std::numeric_limits<float>::quiet_NaN()), "null");
  EXPECT_EQ(ErrorBody("bad \"x\""), R"({"error":"bad \"x\""})");
}

ModelIO TextIO() {
  ModelIO io;
  io.inputs = {{"input_ids", DataType::kInt64, {-1, 4}},
               {"token_type_ids", DataType::kInt64, {-1, 4}}};
  io.outputs = {{"logits", DataType::kFp32, {-1, 2}}};
  io.max_batch_size = 8;
  io.text_inputs = {{"text", DataType::kBytes, {-1}}};
  return io;
}

std::string LengthPrefixed(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    const uint32_t len = static_cast<uint32_t>(item.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += item;
  }
  return out;
}

TEST(CodecTest, TextModelTakesBytesAsJsonOrBinary) {
  const std::string json_body =
      R"({"inputs":[{"name":"text","shape":[2],"datatype":"BYTES",)"
      R"("data":["很好","坏了"]}]})";
  auto req = ParseInferRequest(json_body, std::nullopt, TextIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_TRUE(req->text);
  EXPECT_EQ(req->batch_size, 2);
  ASSERT_EQ(req->inputs.size(), 1u);
  EXPECT_EQ(req->inputs[0].dtype, DataType::kBytes);
  const std::string expected = LengthPrefixed({"很好", "坏了"});
  EXPECT_EQ(std::string(req->inputs[0].data.begin(), req->inputs[0].data.end()), expected);

  const std::string header =
      R"({"inputs":[{"name":"text","shape":[2],"datatype":"BYTES",)"
      R"("parameters":{"binary_data_size":)" + std::to_string(expected.size()) + "}}]}";
  auto bin = ParseInferRequest(header + expected, header.size(), TextIO());
  ASSERT_TRUE(bin.ok()) << bin.status().ToString();
  EXPECT_EQ(bin->inputs[0].data, req->inputs[0].data);
}

TEST(CodecTest, TextModelStillTakesTokenIds) {
  const std::string body =
      R"({"inputs":[{"name":"input_ids","shape":[1,4],"datatype":"INT64","data":[1,5,2,0]},)"
      R"({"name":"token_type_ids","shape":[1,4],"datatype":"INT64","data":[0,0,0,0]}]})";
  auto req = ParseInferRequest(body, std::nullopt, TextIO());
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_FALSE(req->text);
  EXPECT_EQ(req->inputs.size(), 2u);
}

TEST(CodecTest, BytesItemsMustMatchTheShape) {
  const std::string items = LengthPrefixed({"a"});
  const std::string header =
      R"({"inputs":[{"name":"text","shape":[2],"datatype":"BYTES",)"
      R"("parameters":{"binary_data_size":)" + std::to_string(items.size()) + "}}]}";
  auto r = ParseInferRequest(header + items, header.size(), TextIO());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 BYTES items but shape [2] needs 2"),
            std::string::npos) << r.status().message();
  std::string cut = LengthPrefixed({"abc"});
  cut.resize(cut.size() - 1);
  const std::string header2 =
      R"({"inputs":[{"name":"text","shape":[1],"datatype":"BYTES",)"
      R"("parameters":{"binary_data_size":)" + std::to_string(cut.size()) + "}}]}";
  auto r2 = ParseInferRequest(header2 + cut, header2.size(), TextIO());
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("claims 3 bytes"), std::string::npos)
      << r2.status().message();
  // a BYTES item that is not a string
  auto r3 = ParseInferRequest(
      R"({"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":[7]}]})",
      std::nullopt, TextIO());
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("is not a valid BYTES value"), std::string::npos)
      << r3.status().message();
}

}  // namespace
}  // namespace serving

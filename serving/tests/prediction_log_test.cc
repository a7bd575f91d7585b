#include "prediction_log.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "metrics.h"

namespace serving {
namespace {

namespace fs = std::filesystem;

TEST(Base64, MatchesRfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
      {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"}};
  for (const auto& [in, out] : vectors) {
    EXPECT_EQ(Base64Encode(in, std::char_traits<char>::length(in)), out) << in;
  }
  const char bytes[] = {'\x00', '\xff', '\x10'};
  EXPECT_EQ(Base64Encode(bytes, 3), "AP8Q");
}

TEST(RequestId, IsAVersion4UuidAndUnique) {
  const std::regex uuid(
      "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewRequestId();
    EXPECT_TRUE(std::regex_match(id, uuid)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

class PredictionLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("prediction_log_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> Lines() const {
    std::vector<std::string> out;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      for (std::string line; std::getline(in, line);) out.push_back(line);
    }
    return out;
  }
  fs::path dir_;
};

TEST_F(PredictionLogTest, WritesEscapedCloudEventsInOrder) {
  Registry registry;
  PredictionLogOptions options;
  options.dir = dir_.string();
  auto log = PredictionLog::Open(options, &registry);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  for (int i = 0; i < 3; ++i) {
    PredictionRecord r;
    r.id = "id \"" + std::to_string(i) + "\"\n";
    r.model = "m";
    r.version = "2";
    r.time_us = 1796364000123456 + i;
    r.batch = 1;
    r.top1 = {i};
    r.confidence = {0.5f};
    EXPECT_TRUE((*log)->Submit(std::move(r)));
  }
  (*log)->Flush();
  const auto lines = Lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find(R"("id":"id \"0\"\u000a")"), std::string::npos) << lines[0];
  EXPECT_NE(lines[2].find(R"("top1":[2],"confidence":[0.5])"), std::string::npos);
  EXPECT_NE(lines[1].find(R"("time":"2026-12-04T06:00:00.123457Z")"), std::string::npos)
      << lines[1];
  EXPECT_NE(registry.Render().find("serving_prediction_log_written_total 3"),
            std::string::npos);
}

TEST_F(PredictionLogTest, RotationKeepsTheDirectoryBounded) {
  PredictionLogOptions options;
  options.dir = dir_.string();
  options.segment_bytes = 2048;
  options.max_bytes = 8192;
  auto log = PredictionLog::Open(options, nullptr);
  ASSERT_TRUE(log.ok());
  for (int i = 0; i < 400; ++i) {
    PredictionRecord r;
    r.id = std::to_string(i);
    r.model = "m";
    r.version = "1";
    r.output_mean = std::vector<float>(8, 0.25f);
    ASSERT_TRUE((*log)->Submit(std::move(r)));
    if (i % 50 == 0) (*log)->Flush();
  }
  (*log)->Flush();
  int64_t total = 0;
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    total += static_cast<int64_t>(e.file_size());
    ++files;
    EXPECT_LE(static_cast<int64_t>(e.file_size()), 2048);
  }
  EXPECT_LE(total, 8192);
  EXPECT_GE(files, 2);
  const auto lines = Lines();  // the newest records, in order, whole
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find(R"("id":"399")"), std::string::npos);
}

TEST_F(PredictionLogTest, RefusesBadOptionsWithAReadableError) {
  PredictionLogOptions options;
  options.dir = dir_.string();
  options.segment_bytes = 4096;
  options.max_bytes = 1024;
  auto small = PredictionLog::Open(options, nullptr);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("--prediction-log-max-bytes"), std::string::npos);
  options.max_bytes = 1 << 20;
  options.sink_url = "https://collector/";
  auto sink = PredictionLog::Open(options, nullptr);
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.status().message().find("--prediction-log-sink"), std::string::npos);
}

}  // namespace
}  // namespace serving

#include "config.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

namespace serving {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

StatusOr<ServerConfig> Parse(const std::vector<std::string>& args,
                             const FakeEnv& env = {}) {
  bool help = false;
  return ParseConfig(args, env.lookup(), &help);
}

TEST(ConfigTest, Defaults) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->model_dir, "/mnt/models");
  EXPECT_EQ(c->port, 8080);
  EXPECT_EQ(c->host, "0.0.0.0");
  EXPECT_EQ(c->variant, "fp32");
  EXPECT_EQ(c->precision, "f32");
  EXPECT_TRUE(c->dynamic_batching);
  EXPECT_FALSE(c->cpu_pinning);  // two sched_setaffinity calls per inference
  EXPECT_EQ(c->model_name, "");
}

TEST(ConfigTest, FlagForms) {
  auto c =
      Parse({"--port=9000", "--host", "127.0.0.1", "--max-batch-size", "16",
             "--dynamic-batching=false", "--variant=int8", "--workers=2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->port, 9000);
  EXPECT_EQ(c->host, "127.0.0.1");
  EXPECT_EQ(c->max_batch_size, 16);
  EXPECT_FALSE(c->dynamic_batching);
  EXPECT_EQ(c->variant, "int8");
  EXPECT_EQ(c->workers, 2);

  c = Parse({"--dynamic-batching", "--port", "1"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->dynamic_batching);
  c = Parse({"--dynamic-batching", "false"});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->dynamic_batching);
  c = Parse({"--no-dynamic-batching"});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->dynamic_batching);
  c = Parse({"--cpu-pinning"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->cpu_pinning);
}

TEST(ConfigTest, EnvironmentAndPrecedence) {
  FakeEnv env;
  env.vars = {{"SERVING_MAX_BATCH_SIZE", "12"},
              {"SERVING_DYNAMIC_BATCHING", "0"},
              {"PORT", "7001"},
              {"MODEL_DIR", "/models/x"},
              {"MODEL_NAME", "kserve-name"}};
  auto c = Parse({}, env);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_batch_size, 12);
  EXPECT_FALSE(c->dynamic_batching);
  EXPECT_EQ(c->port, 7001);
  EXPECT_EQ(c->model_dir, "/models/x");
  EXPECT_EQ(c->model_name, "kserve-name");
  // SERVING_* beats the KServe name; flags beat both.
  env.vars["SERVING_PORT"] = "7002";
  c = Parse({}, env);
  EXPECT_EQ(c->port, 7002);
  c = Parse({"--port=7003", "--max-batch-size=2"}, env);
  EXPECT_EQ(c->port, 7003);
  EXPECT_EQ(c->max_batch_size, 2);
}

TEST(ConfigTest, RejectsBadInput) {
  auto expect_error = [](const std::vector<std::string>& args,
                         const std::string& fragment, const FakeEnv& env = {}) {
    auto c = Parse(args, env);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(fragment), std::string::npos)
        << c.status().message();
  };
  expect_error({"--bogus=1"}, "unknown flag --bogus");
  expect_error({"--port=abc"}, "'abc' is not an integer");
  expect_error({"--max-batch-size=0"}, "must be >= 1");
  expect_error({"--variant=fp16"}, "not one of fp32|int8");
  expect_error({"--precision=fp64"}, "not one of f32|bf16|auto");
  expect_error({"--dynamic-batching=maybe"}, "not a boolean");
  expect_error({"--port"}, "needs a value");
  expect_error({"positional"}, "unexpected argument");
  expect_error({"--port=70000"}, "is not a TCP port");
  FakeEnv env;
  env.vars = {{"SERVING_WORKERS", "-3"}};
  expect_error({}, "environment SERVING_WORKERS", env);
}

TEST(ConfigTest, AChallengerAtStart) {
  auto none = Parse({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->challenger_model_dir.empty());  // none unless asked
  auto c = Parse({"--challenger-model-dir=/mnt/challenger", "--challenger-version=8",
                  "--challenger-policy=canary", "--challenger-fraction=0.25"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->challenger_model_dir, "/mnt/challenger");
  EXPECT_EQ(c->challenger_version, "8");
  EXPECT_EQ(c->challenger_policy, "canary");
  EXPECT_DOUBLE_EQ(c->challenger_fraction, 0.25);
  auto bad = Parse({"--challenger-policy=mirror"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not one of shadow|canary"), std::string::npos);
  EXPECT_FALSE(Parse({"--challenger-fraction=1.5"}).ok());
}

TEST(ConfigTest, HelpAndUsage) {
  bool help = false;
  auto c = ParseConfig({"--port=x", "--help"}, nullptr, &help);
  EXPECT_TRUE(help);
  const std::string usage = Usage();
  EXPECT_NE(usage.find("--max-queue-delay-us"), std::string::npos);
  EXPECT_NE(usage.find("SERVING_MAX_QUEUE_DELAY_US"), std::string::npos);
  EXPECT_NE(usage.find("SERVING_PORT, PORT"), std::string::npos);
  EXPECT_EQ(EnvNameForFlag("threads-per-worker"), "SERVING_THREADS_PER_WORKER");
}


// A model directory holding `json` as its model_config.json.
class ModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("model_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& json) {
    std::ofstream(dir_ / kModelConfigFile) << json;
  }
  StatusOr<ServerConfig> Apply(std::vector<std::string> args,
                               const FakeEnv& env = {}) {
    args.push_back("--model-dir=" + dir_.string());
    auto parsed = Parse(args, env);
    if (!parsed.ok()) return parsed.status();
    return ApplyModelConfig(*parsed);
  }
  std::filesystem::path dir_;
};

TEST_F(ModelConfigTest, NoFileKeepsTheBuiltInDefaults) {
  auto c = Apply({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_batch_size, kDefaultMaxBatchSize);
  EXPECT_EQ(c->max_queue_delay_us, kDefaultMaxQueueDelayUs);
  EXPECT_EQ(c->max_queue_size, kDefaultMaxQueueSize);
  EXPECT_EQ(c->workers, kDefaultWorkers);
  EXPECT_EQ(c->threads_per_worker, kDefaultThreadsPerWorker);
}

TEST_F(ModelConfigTest, TheFileSetsWhatNeitherFlagNorEnvironmentSets) {
  Write(R"({"max_batch_size": 7, "workers": 2, "threads_per_worker": 1,
            "max_queue_delay_us": 250, "dynamic_batching": false,
            "max_queue_size": 9, "request_timeout_ms": 1234,
            "precision": "bf16", "cpu_pinning": true})");
  auto c = Apply({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_batch_size, 7);
  EXPECT_EQ(c->workers, 2);
  EXPECT_EQ(c->threads_per_worker, 1);
  EXPECT_EQ(c->max_queue_delay_us, 250);
  EXPECT_FALSE(c->dynamic_batching);
  EXPECT_EQ(c->max_queue_size, 9);
  EXPECT_EQ(c->request_timeout_ms, 1234);
  EXPECT_EQ(c->precision, "bf16");
  EXPECT_TRUE(c->cpu_pinning);
}

TEST_F(ModelConfigTest, FlagThenEnvironmentOverrideTheFile) {
  Write(R"({"max_batch_size": 7, "workers": 2, "dynamic_batching": false})");
  FakeEnv env;
  env.vars["SERVING_WORKERS"] = "3";
  env.vars["SERVING_MAX_BATCH_SIZE"] = "5";
  auto c = Apply({"--max-batch-size=4", "--dynamic-batching"}, env);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_batch_size, 4);  // flag > environment > file
  EXPECT_EQ(c->workers, 3);         // environment > file
  EXPECT_TRUE(c->dynamic_batching);  // flag set to the default still wins
  auto negated = Apply({"--no-dynamic-batching"});
  ASSERT_TRUE(negated.ok());
  EXPECT_FALSE(negated->dynamic_batching);
  EXPECT_EQ(negated->workers, 2);
}

TEST_F(ModelConfigTest, BadFilesNameTheFileTheFieldAndTheRule) {
  const std::string path = (dir_ / kModelConfigFile).string();
  struct Case {
    std::string json, expect;
  };
  for (const Case& bad : std::vector<Case>{
           {R"({"max_batch_size": 0})",
            path + ": field 'max_batch_size': must be >= 1, got 0"},
           {R"({"max_batch_size": "8"})",
            path + ": field 'max_batch_size': must be an integer, got \"8\""},
           {R"({"dynamic_batching": 1})",
            path + ": field 'dynamic_batching': must be true or false, got 1"},
           {R"({"log_input_rate": 1.5})",
            path + ": field 'log_input_rate': must be in [0, 1], got 1.5"},
           {R"({"log_input_rate": "0.1"})",
            path + ": field 'log_input_rate': must be a number, got \"0.1\""},
           {R"({"port": 9000})", path + ": field 'port': not a per-model setting"},
           {R"({"max_batch": 8})", path + ": field 'max_batch': not a per-model setting"},
           {R"([1, 2])", path + ": top level must be an object"},
           {R"({"workers": )", path + ": not valid JSON"},
       }) {
    Write(bad.json);
    auto c = Apply({});
    ASSERT_FALSE(c.ok()) << bad.json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message().rfind(bad.expect, 0), 0u)
        << c.status().message() << "\n  wanted prefix: " << bad.expect;
  }
}

TEST_F(ModelConfigTest, TheLogInputRateIsARateFromFileOrFlag) {
  Write(R"({"log_input_rate": 0.25})");
  auto c = Apply({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->log_input_rate, 0.25);
  EXPECT_DOUBLE_EQ(PerModelJson(*c)["log_input_rate"].get<double>(), 0.25);
  auto flag = Apply({"--log-input-rate=1"});
  ASSERT_TRUE(flag.ok());
  EXPECT_DOUBLE_EQ(flag->log_input_rate, 1.0);  // flag > file
  EXPECT_FALSE(Apply({"--log-input-rate=-0.1"}).ok());
  EXPECT_FALSE(Apply({"--log-input-rate=x"}).ok());
  Write(R"({"log_input_rate": 0})");  // an integer is a number too
  ASSERT_TRUE(Apply({}).ok());
}

TEST_F(ModelConfigTest, ABadFileIsAnErrorEvenWhenFlagsSetEverything) {
  Write(R"({"workers": -1})");
  auto c = Apply({"--workers=2"});
  EXPECT_FALSE(c.ok());  // validated, not silently ignored
}

TEST(ModelConfigKeys, EveryPerModelSettingIsAFlag) {
  for (const std::string& key : PerModelSettings()) {
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    bool help = false;
    auto c = ParseConfig({"--" + flag + "=1"}, [](const char*) -> const char* { return nullptr; }, &help);
    // Known flag: parses, or fails on the value, never as unknown.
    if (!c.ok()) {
      EXPECT_EQ(c.status().message().find("unknown"), std::string::npos)
          << key << ": " << c.status().message();
    }
  }
}

}  // namespace
}  // namespace serving

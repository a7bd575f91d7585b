#include "metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace serving {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(MetricsTest, RendersCounterWithLabels) {
  Registry registry;
  auto& family = registry.AddCounter("requests_total", "Requests.", {"code"});
  family.counter({"200"}).Increment();
  family.counter({"200"}).Increment(2);
  family.counter({"400"}).Increment();
  const std::string text = registry.Render();
  EXPECT_TRUE(Contains(text, "# HELP requests_total Requests.\n"));
  EXPECT_TRUE(Contains(text, "# TYPE requests_total counter\n"));
  EXPECT_TRUE(Contains(text, "requests_total{code=\"200\"} 3\n"));
  EXPECT_TRUE(Contains(text, "requests_total{code=\"400\"} 1\n"));
}

TEST(MetricsTest, RendersHistogramBucketsSumAndCount) {
  Registry registry;
  auto& h =
      registry
          .AddHistogram("latency_seconds", "Latency.", {"model"}, {0.1, 1.0})
          .histogram({"m"});
  h.Observe(0.0625);
  h.Observe(0.5);
  h.Observe(0.5);
  h.Observe(3.0);
  const std::string text = registry.Render();
  EXPECT_TRUE(Contains(text, "# TYPE latency_seconds histogram\n"));
  EXPECT_TRUE(
      Contains(text, "latency_seconds_bucket{model=\"m\",le=\"0.1\"} 1\n"));
  EXPECT_TRUE(
      Contains(text, "latency_seconds_bucket{model=\"m\",le=\"1\"} 3\n"));
  EXPECT_TRUE(
      Contains(text, "latency_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"));
  EXPECT_TRUE(Contains(text, "latency_seconds_sum{model=\"m\"} 4.0625\n"));
  EXPECT_TRUE(Contains(text, "latency_seconds_count{model=\"m\"} 4\n"));
}

TEST(MetricsTest, GaugesAndCallbacks) {
  Registry registry;
  auto& g = registry.AddGauge("inflight", "In flight.");
  g.gauge().Add(2);
  g.gauge().Add(-1);
  int depth = 7;
  registry.AddGauge("depth", "Depth.", {"m"}).SetGaugeCallback({"x"}, [&depth] {
    return depth;
  });
  std::string text = registry.Render();
  EXPECT_TRUE(Contains(text, "inflight 1\n"));
  EXPECT_TRUE(Contains(text, "depth{m=\"x\"} 7\n"));
  depth = 3;
  EXPECT_TRUE(Contains(registry.Render(), "depth{m=\"x\"} 3\n"));
}

TEST(MetricsTest, EscapesLabelValuesAndFormatsValues) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(FormatMetricValue(3), "3");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(1.0 / 0.0), "+Inf");
  Registry registry;
  registry.AddCounter("c_total", "C.", {"path"}).counter({"/a\"b"}).Increment();
  EXPECT_TRUE(Contains(registry.Render(), "c_total{path=\"/a\\\"b\"} 1\n"));
}

TEST(MetricsTest, EveryLineIsWellFormed) {
  Registry registry;
  ServingMetrics metrics(&registry, "digits-classifier", "1", 32);
  metrics.RecordInferRequest(200, 0.004);
  metrics.RecordInferRequest(400, 0.001);
  metrics.RecordInferRequest(413, 0.0);
  metrics.RecordHttpRequest("GET", 200);
  metrics.RecordQueueTime(0.0005);
  metrics.RecordBatch(8, 3, 0.002);
  metrics.SetReady(true);
  metrics.SetQueueDepthCallback([] { return 2.0; });
  const std::string text = registry.Render();
  EXPECT_TRUE(Contains(text,
                       "kserve_requests_total{model=\"digits-classifier\","
                       "version=\"1\",code=\"200\"} 1\n"));
  EXPECT_TRUE(Contains(
      text,
      "kserve_request_failures_total{model=\"digits-classifier\",version=\"1\","
      "reason=\"payload_too_large\"} 1\n"));
  EXPECT_TRUE(Contains(text,
                       "kserve_batch_size_bucket{model=\"digits-classifier\","
                       "version=\"1\",le=\"8\"} 1\n"));
  EXPECT_TRUE(Contains(
      text,
      "kserve_batch_size_sum{model=\"digits-classifier\",version=\"1\"} 8\n"));
  EXPECT_TRUE(Contains(text,
                       "kserve_compute_duration_seconds_count{model=\"digits-"
                       "classifier\",version=\"1\"} 1\n"));
  EXPECT_TRUE(Contains(text,
                       "kserve_queue_duration_seconds_count{model=\"digits-"
                       "classifier\",version=\"1\"} 1\n"));
  EXPECT_TRUE(Contains(text,
                       "kserve_inference_samples_total{model=\"digits-"
                       "classifier\",version=\"1\"} 8\n"));
  EXPECT_TRUE(Contains(
      text,
      "kserve_model_ready{model=\"digits-classifier\",version=\"1\"} 1\n"));
  EXPECT_TRUE(Contains(
      text,
      "kserve_queue_depth{model=\"digits-classifier\",version=\"1\"} 2\n"));
  // Every non-comment line is `name{labels} value` or `name value`.
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    ASSERT_NE(end, std::string::npos) << "output must end with a newline";
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0)
      continue;
    const size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_EQ(
        name.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:"),
        std::string::npos)
        << line;
    const std::string value = line.substr(space + 1);
    EXPECT_FALSE(value.empty()) << line;
    if (value != "+Inf" && value != "-Inf" && value != "NaN") {
      size_t used = 0;
      (void)std::stod(value, &used);
      EXPECT_EQ(used, value.size()) << line;
    }
  }
}

TEST(MetricsTest, ConcurrentUpdatesAreCounted) {
  Registry registry;
  auto& family = registry.AddCounter("n_total", "N.", {"k"});
  auto& hist = registry.AddHistogram("h", "H.", {}, {1.0}).histogram();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        family.counter({"a"}).Increment();
        hist.Observe(0.5);
      }
    });
  }
  for (auto& th : threads)
    th.join();
  const std::string text = registry.Render();
  EXPECT_TRUE(Contains(text, "n_total{k=\"a\"} 8000\n"));
  EXPECT_TRUE(Contains(text, "h_count 8000\n"));
  EXPECT_TRUE(Contains(text, "h_bucket{le=\"1\"} 8000\n"));
}

}  // namespace
}  // namespace serving

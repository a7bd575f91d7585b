// Prometheus metrics (text exposition format 0.0.4) without dependencies:
// labelled counter, gauge and histogram families in a Registry, plus
// ServingMetrics, the instruments this server records.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace serving {

using LabelValues = std::vector<std::string>;

class Counter {
 public:
  void Increment(double amount = 1.0);
  double value() const { return value_.load(); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value); }
  void Add(double amount);
  double value() const { return value_.load(); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // bounds_.size() + 1 buckets
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

enum class MetricType { kCounter, kGauge, kHistogram };

// One metric name with a fixed set of label names; children per label values.
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names,
               std::vector<double> buckets = {});

  // The child for `values` (created on first use; references stay valid).
  Counter& counter(const LabelValues& values = {});
  Gauge& gauge(const LabelValues& values = {});
  Histogram& histogram(const LabelValues& values = {});
  // A gauge child whose value is read when rendering.
  void SetGaugeCallback(const LabelValues& values,
                        std::function<double()> callback);

  void Render(std::string* out) const;
  const std::string& name() const { return name_; }

 private:
  struct Child {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> callback;
  };
  Child& GetChild(const LabelValues& values);
  std::string Labels(const LabelValues& values,
                     const std::string& extra_name = "",
                     const std::string& extra_value = "") const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::vector<double> buckets_;
  mutable std::mutex mu_;
  std::map<LabelValues, Child> children_;
};

class Registry {
 public:
  // Adding a name that exists returns the existing family.
  MetricFamily& AddCounter(const std::string& name, const std::string& help,
                           std::vector<std::string> labels = {});
  MetricFamily& AddGauge(const std::string& name, const std::string& help,
                         std::vector<std::string> labels = {});
  MetricFamily& AddHistogram(const std::string& name, const std::string& help,
                             std::vector<std::string> labels,
                             std::vector<double> buckets);
  // Prometheus text format, families in registration order.
  std::string Render() const;

 private:
  MetricFamily& Add(std::unique_ptr<MetricFamily> family);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_;
};

// Escapes a label value (\\, \", \n) for the text format.
std::string EscapeLabelValue(const std::string& value);
// Sample value text: integers without exponent, others shortest round-trip,
// "+Inf"/"-Inf"/"NaN".
std::string FormatMetricValue(double value);

// Latency buckets in seconds (100 us .. 10 s).
std::vector<double> DefaultLatencyBuckets();

// The instruments of one served model (labels model, version).
class ServingMetrics {
 public:
  ServingMetrics(Registry* registry, const std::string& model,
                 const std::string& version, int64_t max_batch_size);

  // One finished infer request (any status, including ones rejected before
  // the handler ran, e.g. 413), its HTTP status and end-to-end seconds.
  void RecordInferRequest(int http_status, double seconds);
  // Every HTTP response.
  void RecordHttpRequest(const std::string& method, int http_status);
  void RecordQueueTime(double seconds);
  void RecordBatch(int64_t samples, size_t requests, double compute_seconds);
  void SetReady(bool ready);
  void AddInflight(int delta);
  void SetQueueDepthCallback(std::function<double()> callback);

  static const char* FailureReason(int http_status);

 private:
  const LabelValues model_labels_;
  MetricFamily& requests_;
  MetricFamily& failures_;
  MetricFamily& http_requests_;
  Histogram& request_duration_;
  Histogram& queue_duration_;
  Histogram& compute_duration_;
  Histogram& batch_size_;
  Histogram& batch_requests_;
  Counter& samples_;
  Gauge& ready_;
  Gauge& inflight_;
  MetricFamily& queue_depth_;
};

}  // namespace serving

#include "metrics.h"

#include <charconv>
#include <cmath>
#include <utility>

namespace serving {
namespace {

void AtomicAdd(std::atomic<double>* target, double amount) {
  double current = target->load();
  while (!target->compare_exchange_weak(current, current + amount)) {
  }
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void Counter::Increment(double amount) {
  if (amount > 0) AtomicAdd(&value_, amount);
}

void Gauge::Add(double amount) {
  AtomicAdd(&value_, amount);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket])
    ++bucket;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snap;
  snap.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    snap.cumulative.push_back(running);
  }
  snap.sum = sum_;
  snap.count = count_;
  return snap;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

std::vector<double> DefaultLatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
}

MetricFamily::MetricFamily(std::string name, std::string help, MetricType type,
                           std::vector<std::string> label_names,
                           std::vector<double> buckets)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      buckets_(std::move(buckets)) {}

MetricFamily::Child& MetricFamily::GetChild(const LabelValues& values) {
  LabelValues key = values;
  key.resize(label_names_.size());
  std::lock_guard<std::mutex> lock(mu_);
  Child& child = children_[key];
  if (type_ == MetricType::kCounter && !child.counter) {
    child.counter = std::make_unique<Counter>();
  } else if (type_ == MetricType::kGauge && !child.gauge) {
    child.gauge = std::make_unique<Gauge>();
  } else if (type_ == MetricType::kHistogram && !child.histogram) {
    child.histogram = std::make_unique<Histogram>(buckets_);
  }
  return child;
}

Counter& MetricFamily::counter(const LabelValues& values) {
  return *GetChild(values).counter;
}
Gauge& MetricFamily::gauge(const LabelValues& values) {
  return *GetChild(values).gauge;
}
Histogram& MetricFamily::histogram(const LabelValues& values) {
  return *GetChild(values).histogram;
}

void MetricFamily::SetGaugeCallback(const LabelValues& values,
                                    std::function<double()> callback) {
  Child& child = GetChild(values);
  std::lock_guard<std::mutex> lock(mu_);
  child.callback = std::move(callback);
}

std::string MetricFamily::Labels(const LabelValues& values,
                                 const std::string& extra_name,
                                 const std::string& extra_value) const {
  std::string out;
  for (size_t i = 0; i < label_names_.size(); ++i) {
    if (!out.empty()) out += ",";
    out += label_names_[i] + "=\"" + EscapeLabelValue(values[i]) + "\"";
  }
  if (!extra_name.empty()) {
    if (!out.empty()) out += ",";
    out += extra_name + "=\"" + EscapeLabelValue(extra_value) + "\"";
  }
  return out.empty() ? out : "{" + out + "}";
}

void MetricFamily::Render(std::string* out) const {
  *out += "# HELP " + name_ + " " + EscapeHelp(help_) + "\n";
  *out += "# TYPE " + name_ + " " + TypeName(type_) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, child] : children_) {
    switch (type_) {
      case MetricType::kCounter:
        *out += name_ + Labels(values) + " " +
                FormatMetricValue(child.counter->value()) + "\n";
        break;
      case MetricType::kGauge: {
        const double v =
            child.callback ? child.callback() : child.gauge->value();
        *out += name_ + Labels(values) + " " + FormatMetricValue(v) + "\n";
        break;
      }
      case MetricType::kHistogram: {
        const auto snap = child.histogram->snapshot();
        for (size_t i = 0; i <= snap.bounds.size(); ++i) {
          const std::string le = i < snap.bounds.size()
                                     ? FormatMetricValue(snap.bounds[i])
                                     : "+Inf";
          *out += name_ + "_bucket" + Labels(values, "le", le) + " " +
                  FormatMetricValue(static_cast<double>(snap.cumulative[i])) +
                  "\n";
        }
        *out += name_ + "_sum" + Labels(values) + " " +
                FormatMetricValue(snap.sum) + "\n";
        *out += name_ + "_count" + Labels(values) + " " +
                FormatMetricValue(static_cast<double>(snap.count)) + "\n";
        break;
      }
    }
  }
}

MetricFamily& Registry::Add(std::unique_ptr<MetricFamily> family) {
  std::lock_guard<std::mutex> lock(mu_);
  // One family per name: a second ServingMetrics (another model version)
  // shares the families and adds its own label values.
  for (const auto& existing : families_) {
    if (existing->name() == family->name()) return *existing;
  }
  families_.push_back(std::move(family));
  return *families_.back();
}

MetricFamily& Registry::AddCounter(const std::string& name,
                                   const std::string& help,
                                   std::vector<std::string> labels) {
  return Add(std::make_unique<MetricFamily>(name, help, MetricType::kCounter,
                                            std::move(labels)));
}

MetricFamily& Registry::AddGauge(const std::string& name,
                                 const std::string& help,
                                 std::vector<std::string> labels) {
  return Add(std::make_unique<MetricFamily>(name, help, MetricType::kGauge,
                                            std::move(labels)));
}

MetricFamily& Registry::AddHistogram(const std::string& name,
                                     const std::string& help,
                                     std::vector<std::string> labels,
                                     std::vector<double> buckets) {
  return Add(std::make_unique<MetricFamily>(name, help, MetricType::kHistogram,
                                            std::move(labels),
                                            std::move(buckets)));
}

std::string Registry::Render() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& family : families_)
    family->Render(&out);
  return out;
}

namespace {
std::vector<double> BatchBuckets(int64_t max_batch_size) {
  std::vector<double> buckets;
  for (int64_t b = 1; b < max_batch_size; b *= 2) {
    buckets.push_back(static_cast<double>(b));
  }
  buckets.push_back(
      static_cast<double>(max_batch_size < 1 ? 1 : max_batch_size));
  return buckets;
}
}  // namespace

ServingMetrics::ServingMetrics(Registry* registry, const std::string& model,
                               const std::string& version,
                               int64_t max_batch_size)
    : model_labels_{model, version},
      requests_(registry->AddCounter("kserve_requests_total",
                                     "Inference requests by HTTP status code.",
                                     {"model", "version", "code"})),
      failures_(registry->AddCounter("kserve_request_failures_total",
                                     "Failed inference requests by reason.",
                                     {"model", "version", "reason"})),
      http_requests_(registry->AddCounter(
          "kserve_http_requests_total",
          "HTTP responses on every endpoint by method and status code.",
          {"method", "code"})),
      request_duration_(registry
                            ->AddHistogram("kserve_request_duration_seconds",
                                           "End-to-end inference request "
                                           "latency in the server.",
                                           {"model", "version"},
                                           DefaultLatencyBuckets())
                            .histogram(model_labels_)),
      queue_duration_(registry
                          ->AddHistogram("kserve_queue_duration_seconds",
                                         "Time a request waited in the "
                                         "batcher queue.",
                                         {"model", "version"},
                                         DefaultLatencyBuckets())
                          .histogram(model_labels_)),
      compute_duration_(registry
                            ->AddHistogram("kserve_compute_duration_seconds",
                                           "Backend execution time of one "
                                           "batch.",
                                           {"model", "version"},
                                           DefaultLatencyBuckets())
                            .histogram(model_labels_)),
      batch_size_(registry
                      ->AddHistogram("kserve_batch_size",
                                     "Samples (dim 0) per executed batch.",
                                     {"model", "version"},
                                     BatchBuckets(max_batch_size))
                      .histogram(model_labels_)),
      batch_requests_(registry
                          ->AddHistogram("kserve_batch_requests",
                                         "Requests merged per executed "
                                         "batch.",
                                         {"model", "version"},
                                         BatchBuckets(max_batch_size))
                          .histogram(model_labels_)),
      samples_(registry
                   ->AddCounter("kserve_inference_samples_total",
                                "Samples (dim 0) inferred.",
                                {"model", "version"})
                   .counter(model_labels_)),
      ready_(registry
                 ->AddGauge("kserve_model_ready",
                            "1 when the model is ready to serve.",
                            {"model", "version"})
                 .gauge(model_labels_)),
      inflight_(registry
                    ->AddGauge("kserve_inflight_requests",
                               "Inference requests being handled.",
                               {"model", "version"})
                    .gauge(model_labels_)),
      queue_depth_(registry->AddGauge("kserve_queue_depth",
                                      "Requests waiting in the batcher queue.",
                                      {"model", "version"})) {}

const char* ServingMetrics::FailureReason(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request";
    case 404:
      return "not_found";
    case 413:
      return "payload_too_large";
    case 503:
      return "unavailable";
    case 504:
      return "timeout";
    default:
      return http_status >= 500 ? "internal" : "client_error";
  }
}

void ServingMetrics::RecordInferRequest(int http_status, double seconds) {
  requests_
      .counter(
          {model_labels_[0], model_labels_[1], std::to_string(http_status)})
      .Increment();
  if (http_status >= 400) {
    failures_
        .counter(
            {model_labels_[0], model_labels_[1], FailureReason(http_status)})
        .Increment();
  }
  request_duration_.Observe(seconds);
}

void ServingMetrics::RecordHttpRequest(const std::string& method,
                                       int http_status) {
  http_requests_.counter({method, std::to_string(http_status)}).Increment();
}

void ServingMetrics::RecordQueueTime(double seconds) {
  queue_duration_.Observe(seconds);
}

void ServingMetrics::RecordBatch(int64_t samples, size_t requests,
                                 double compute_seconds) {
  batch_size_.Observe(static_cast<double>(samples));
  batch_requests_.Observe(static_cast<double>(requests));
  compute_duration_.Observe(compute_seconds);
  samples_.Increment(static_cast<double>(samples));
}

void ServingMetrics::SetReady(bool ready) {
  ready_.Set(ready ? 1.0 : 0.0);
}

void ServingMetrics::AddInflight(int delta) {
  inflight_.Add(delta);
}

void ServingMetrics::SetQueueDepthCallback(std::function<double()> callback) {
  queue_depth_.SetGaugeCallback(model_labels_, std::move(callback));
}

}  // namespace serving

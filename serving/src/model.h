// A served model: signature.json + backend + dynamic batcher, and the
// KServe v2 model metadata derived from them.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend.h"
#include "batcher.h"
#include "codec.h"
#include "config.h"
#include "signature.h"
#include "prediction_log.h"
#include "stats.h"
#include "status.h"
#include "tokenizer.h"

namespace serving {

class ServingMetrics;

// How a request's answer is filed in the prediction log.
struct LogContext {
  std::string id;    // the request id (empty: a generated UUID)
  std::string role;  // "" (one version served), "champion" or "challenger"
  bool answered = true;  // false: a shadow run whose answer no client sees
};

using BackendFactory =
    std::function<StatusOr<std::unique_ptr<Backend>>(const BackendOptions&)>;

class Model {
 public:
  // Reads signature.json and resolves names and files; fast, no runtime yet.
  static StatusOr<std::unique_ptr<Model>> Create(const ServerConfig& config,
                                                 BackendFactory factory);
  ~Model();

  // Builds the backend (compiles the model) and starts the batcher workers;
  // the model is ready afterwards. `metrics` (nullable) must outlive it.
  Status Load(ServingMetrics* metrics);

  // Queues one request: `done` gets the outputs (model output order) or the
  // error exactly once, either from this call (bad input, not ready, stopped)
  // or later from a batcher worker (see InferJob::Callback). `inputs` are the
  // model's inputs, or (a text model) its one BYTES text input, tokenized
  // here first. With a prediction log, the answer (or error) is logged as
  // `context` says, after `done` ran.
  void InferAsync(std::vector<Tensor> inputs, Clock::time_point deadline,
                  InferJob::Callback done, const LogContext& context = {});

  // Where this version logs its answers (nullable; must outlive the model).
  void SetPredictionLog(PredictionLog* log);

  // Stops the batcher after running what is queued; InferAsync then fails.
  void Stop();

  bool ready() const { return ready_.load(std::memory_order_acquire); }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  std::string platform() const;
  const ModelIO& io() const { return io_; }
  const BackendOptions& backend_options() const { return backend_options_; }
  size_t queue_depth() const;
  // Requests queued or running (0 once Stop() returned).
  size_t pending() const;
  const ModelStats& stats() const { return stats_; }
  // The metrics passed to Load (nullptr before).
  ServingMetrics* metrics() const { return metrics_; }

  // {"name", "versions", "platform", "inputs", "outputs"}
  nlohmann::json Metadata() const;
  // The per-model settings this version runs with (flag > environment >
  // its model_config.json > default), in model_config.json's form, plus
  // "model_config_file": the file read, or null.
  nlohmann::json Config() const;

 private:
  Model() = default;

  std::string name_;
  std::string version_;
  ServerConfig config_;
  ModelSignature signature_;
  ModelIO io_;
  BackendOptions backend_options_;
  BackendFactory factory_;
  BatcherOptions batcher_options_;
  std::unique_ptr<Tokenizer> tokenizer_;  // text models (assets/tokenizer.json)

  // The bundle's warm-up samples (<model_dir>/warmup.json,
  // components/ml/serving/warmup.py), one tensor per model input, dim 0 the samples; empty: none.
  std::vector<Tensor> warmup_;
  // Reads warmup.json and its files, checked against the signature.
  Status ReadWarmup();
  // Runs every batch size the batcher may form (1 ... max batch size) on
  // execution context `instance`, from warmup_ (called by that context's
  // batcher worker): the runtime builds its state for each shape and thread
  // now, not on a client's request.
  Status WarmInstance(Backend* backend, size_t instance) const;

  // The token-id inputs of a batch of raw texts (the BYTES text input).
  StatusOr<std::vector<Tensor>> Tokenize(const Tensor& texts) const;
  // Tokenizes text and queues the job.
  Status Submit(std::vector<Tensor> inputs, Clock::time_point deadline,
                InferJob::Callback done, std::shared_ptr<InferJob>* job);

  // The prediction record of a request, filled from its result.
  void Summarize(const StatusOr<std::vector<Tensor>>& result,
                 PredictionRecord* record) const;

  PredictionLog* log_ = nullptr;

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DynamicBatcher> batcher_;
  ModelStats stats_;
  ServingMetrics* metrics_ = nullptr;
  std::atomic<bool> ready_{false};
  mutable std::mutex mu_;  // guards batcher_ for queue_depth() during Load
};

// "openvino_paddle" (OpenVINO backend, .pdmodel or IR), "paddle_inference".
std::string PlatformName(const BackendOptions& options);

}  // namespace serving

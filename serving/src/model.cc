#include "model.h"

#include <fstream>

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "logging.h"
#include "metrics.h"

namespace serving {
namespace {

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string JoinPath(const std::string& dir, const std::string& rel) {
  if (rel.empty() || rel[0] == '/') return rel;
  if (dir.empty()) return rel;
  return dir.back() == '/' ? dir + rel : dir + "/" + rel;
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

nlohmann::json SpecsJson(const std::vector<TensorSpec>& specs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& spec : specs) {
    out.push_back({{"name", spec.name},
                   {"datatype", DataTypeName(spec.dtype)},
                   {"shape", spec.shape}});
  }
  return out;
}

bool Batchable(const ModelSignature& sig) {
  for (const auto* list : {&sig.inputs, &sig.outputs}) {
    for (const auto& spec : *list) {
      if (spec.shape.empty() || spec.shape[0] != -1) return false;
    }
  }
  return true;
}

}  // namespace

std::string PlatformName(const BackendOptions& options) {
  // Both variants are Paddle-exported models (the int8 one converted to IR).
  if (options.kind == "paddle") return "paddle_inference";
  return "openvino_paddle";
}

StatusOr<std::unique_ptr<Model>> Model::Create(const ServerConfig& operator_config,
                                               BackendFactory factory) {
  // The model's own settings (model_config.json beside signature.json), under
  // whatever the operator set by flag or environment.
  ASSIGN_OR_RETURN(const ServerConfig config, ApplyModelConfig(operator_config));
  std::unique_ptr<Model> model(new Model());
  model->config_ = config;
  model->factory_ = std::move(factory);
  const std::string sig_path = JoinPath(config.model_dir, "signature.json");
  ASSIGN_OR_RETURN(model->signature_, ModelSignature::Load(sig_path));
  const ModelSignature& sig = model->signature_;

  model->name_ = !config.model_name.empty()
                     ? config.model_name
                     : (sig.task.empty() ? "model" : sig.task + "-classifier");
  model->version_ = config.model_version;
  if (model->name_.find('/') != std::string::npos ||
      model->version_.find('/') != std::string::npos) {
    return InvalidArgument("model name and version must not contain '/'");
  }

  // Which program/params to load.
  BackendOptions& opts = model->backend_options_;
  opts.kind = config.backend;
  std::string format_key;
  if (config.backend == "paddle") {
    format_key = config.variant == "int8"
                     ? "int8_paddle"
                     : (sig.formats.count("pir") ? "pir" : "legacy");
  } else {
    // fp32: the legacy program, or ONNX for a model that has none (e.g. ERNIE,
    // which Paddle 3.3 cannot save in the legacy format)
    format_key = config.variant == "int8"
                     ? "int8_openvino"
                     : (sig.formats.count("legacy") ? "legacy" : "onnx");
  }
  if (!config.model_file.empty()) {
    opts.model_path = config.model_file;
    opts.params_path = config.params_file;
    if (opts.params_path.empty() && EndsWith(opts.model_path, ".pdmodel")) {
      opts.params_path =
          opts.model_path.substr(0, opts.model_path.size() - 8) + ".pdiparams";
    }
  } else {
    const auto it = sig.formats.find(format_key);
    if (it == sig.formats.end() || it->second.program.empty()) {
      return NotFound(sig_path + " has no formats." + format_key +
                      ".program for --variant=" + config.variant +
                      " --backend=" + config.backend);
    }
    opts.model_path = JoinPath(config.model_dir, it->second.program);
    opts.params_path = config.params_file.empty()
                           ? JoinPath(config.model_dir, it->second.params)
                           : config.params_file;
    opts.runtime_input_names = it->second.input_names;
    opts.runtime_output_names = it->second.output_names;
  }
  if (!FileExists(opts.model_path)) {
    return NotFound("model file " + opts.model_path + " does not exist");
  }
  opts.device = config.device;
  opts.precision = config.precision;
  opts.cpu_pinning = config.cpu_pinning;
  opts.instances = config.workers;
  opts.threads_per_instance = config.threads_per_worker;
  opts.max_batch_size = config.max_batch_size;
  opts.inputs = sig.inputs;
  opts.outputs = sig.outputs;
  opts.tensorrt = config.paddle_tensorrt;
  opts.gpu_memory_mb = config.gpu_memory_mb;

  model->io_.inputs = sig.inputs;
  model->io_.outputs = sig.outputs;
  model->io_.max_batch_size = config.max_batch_size;
  model->io_.labels = sig.label_names;

  // A text model ships its tokenizer: then it also takes raw text.
  const std::string assets = JoinPath(config.model_dir, "assets");
  if (FileExists(JoinPath(assets, "tokenizer.json"))) {
    ASSIGN_OR_RETURN(model->tokenizer_, Tokenizer::Load(assets));
    const auto& in = sig.inputs;
    const int64_t len = model->tokenizer_->max_seq_len();
    if (in.size() != 2 || in[0].dtype != DataType::kInt64 ||
        in[1].dtype != DataType::kInt64 || in[0].shape != Shape({-1, len}) ||
        in[1].shape != Shape({-1, len})) {
      return InvalidArgument(
          assets + "/tokenizer.json: a tokenizer needs two INT64 inputs "
          "[-1, max_seq_len=" + std::to_string(len) + "] (input_ids, "
          "token_type_ids) in signature.json");
    }
    model->io_.text_inputs = {TensorSpec{"text", DataType::kBytes, {-1}}};
  }

  model->batcher_options_.max_batch_size = config.max_batch_size;
  model->batcher_options_.max_queue_delay_us = config.max_queue_delay_us;
  model->batcher_options_.dynamic_batching = config.dynamic_batching;
  model->batcher_options_.max_queue_size = config.max_queue_size;
  if (!Batchable(sig)) {
    // Fixed dim 0: requests must match it exactly and run one at a time.
    model->batcher_options_.dynamic_batching = false;
    int64_t fixed = 1;
    if (!sig.inputs[0].shape.empty() && sig.inputs[0].shape[0] > 0) {
      fixed = sig.inputs[0].shape[0];
    }
    model->batcher_options_.max_batch_size =
        std::max<int64_t>(fixed, config.max_batch_size);
    model->io_.max_batch_size = model->batcher_options_.max_batch_size;
    LogWarn("signature has no dynamic batch dimension; dynamic batching off",
            {{"model", model->name_}});
  }
  RETURN_IF_ERROR(model->ReadWarmup());
  return model;
}

Model::~Model() {
  Stop();
}

// The bundle's warm-up description (components/ml/serving/warmup.py: WARMUP_FILE).
constexpr const char* kWarmupFile = "warmup.json";

Status Model::ReadWarmup() {
  const std::string path = JoinPath(config_.model_dir, kWarmupFile);
  if (!FileExists(path)) return Status::Ok();
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidArgument(path + ": not a JSON object");
  }
  if (!doc.contains("samples") || !doc["samples"].is_number_integer() ||
      doc["samples"].get<int64_t>() < 1) {
    return InvalidArgument(path + ": field 'samples' must be an integer >= 1");
  }
  const int64_t samples = doc["samples"].get<int64_t>();
  if (!doc.contains("inputs") || !doc["inputs"].is_array() ||
      doc["inputs"].size() != io_.inputs.size()) {
    return InvalidArgument(path + ": field 'inputs' must list the " +
                           std::to_string(io_.inputs.size()) +
                           " inputs of signature.json, in its order");
  }
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < io_.inputs.size(); ++i) {
    const TensorSpec& spec = io_.inputs[i];
    const nlohmann::json& entry = doc["inputs"][i];
    const std::string field = "inputs[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        entry["name"].get<std::string>() != spec.name || !entry.contains("file") ||
        !entry["file"].is_string()) {
      return InvalidArgument(path + ": field '" + field + "' must be {\"name\": \"" +
                             spec.name + "\", \"file\": ...} (signature.json order)");
    }
    Shape shape = spec.shape;
    if (shape.empty()) return InvalidArgument(path + ": input '" + spec.name + "' is a scalar");
    shape[0] = samples;
    for (size_t d = 1; d < shape.size(); ++d) {
      if (shape[d] < 0) {
        return InvalidArgument(path + ": input '" + spec.name +
                               "' has a dynamic dimension besides the batch");
      }
    }
    Tensor tensor = Tensor::Allocate(spec.name, spec.dtype, shape);
    const std::string file = JoinPath(config_.model_dir, entry["file"].get<std::string>());
    std::ifstream data(file, std::ios::binary | std::ios::ate);
    if (!data) return InvalidArgument(path + ": field '" + field + ".file' " + file + " cannot be read");
    const auto size = static_cast<size_t>(data.tellg());
    if (size != tensor.byte_size()) {
      return InvalidArgument(file + ": " + std::to_string(size) + " bytes, but " +
                             std::to_string(samples) + " samples of input '" + spec.name +
                             "' take " + std::to_string(tensor.byte_size()));
    }
    data.seekg(0);
    data.read(tensor.data.data(), static_cast<std::streamsize>(size));
    tensors.push_back(std::move(tensor));
  }
  warmup_ = std::move(tensors);
  return Status::Ok();
}

Status Model::WarmInstance(Backend* backend, size_t instance) const {
  const int64_t samples = warmup_[0].shape[0];
  const int64_t last = batcher_options_.max_batch_size;
  // a fixed batch dimension: that size only
  const int64_t first = Batchable(signature_) ? 1 : last;
  // the largest first: the last run (the state the caches are left in) is
  // the smallest batch, the most frequent one
  for (int64_t batch = last; batch >= first; --batch) {
    std::vector<Tensor> inputs;
    for (const Tensor& source : warmup_) {
      Shape shape = source.shape;
      shape[0] = batch;
      Tensor tensor = Tensor::Allocate(source.name, source.dtype, shape);
      const size_t row = source.byte_size() / static_cast<size_t>(samples);
      for (int64_t b = 0; b < batch; ++b) {
        std::memcpy(tensor.data.data() + b * row,
                    source.data.data() + (b % samples) * row, row);
      }
      inputs.push_back(std::move(tensor));
    }
    std::vector<Tensor> outputs;
    const Status status = backend->Infer(instance, inputs, &outputs);
    if (!status.ok()) {
      return Internal("warm-up of model '" + name_ + "' version " + version_ +
                      " at batch " + std::to_string(batch) + " on worker " +
                      std::to_string(instance) + ": " + status.message());
    }
  }
  return Status::Ok();
}

Status Model::Load(ServingMetrics* metrics) {
  if (ready()) return Status::Ok();
  ASSIGN_OR_RETURN(auto backend, factory_(backend_options_));
  if (backend->InputSpecs().size() != io_.inputs.size() ||
      backend->OutputSpecs().size() != io_.outputs.size()) {
    return InvalidArgument("the model program has " +
                           std::to_string(backend->InputSpecs().size()) +
                           " inputs / " +
                           std::to_string(backend->OutputSpecs().size()) +
                           " outputs but signature.json declares " +
                           std::to_string(io_.inputs.size()) + " / " +
                           std::to_string(io_.outputs.size()));
  }
  // Each worker warms its own context on its own thread before it takes work:
  // every batch size it may form, so no client pays for a first run.
  const auto start = Clock::now();
  DynamicBatcher::WarmFn warm;
  Backend* runtime = backend.get();
  if (!warmup_.empty()) {
    warm = [this, runtime](size_t instance) { return WarmInstance(runtime, instance); };
  }
  ASSIGN_OR_RETURN(auto batcher,
                   DynamicBatcher::Create(batcher_options_, backend.get(),
                                          metrics, &stats_, warm));
  if (warm) {
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    LogInfo("warmed up", {{"model", name_},
                          {"version", version_},
                          {"max_batch_size", batcher_options_.max_batch_size},
                          {"workers", runtime->InstanceCount()},
                          {"ms", std::round(ms * 10) / 10}});
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    backend_ = std::move(backend);
    batcher_ = std::move(batcher);
    metrics_ = metrics;
  }
  ready_.store(true, std::memory_order_release);
  return Status::Ok();
}

StatusOr<std::vector<Tensor>> Model::Tokenize(const Tensor& texts) const {
  const int64_t batch = texts.shape.empty() ? 0 : texts.shape[0];
  const int64_t len = tokenizer_->max_seq_len();
  std::vector<Tensor> out;
  out.push_back(Tensor::Allocate(io_.inputs[0].name, DataType::kInt64, {batch, len}));
  // one segment: token_type_ids stay 0
  out.push_back(Tensor::Allocate(io_.inputs[1].name, DataType::kInt64, {batch, len}));
  size_t offset = 0;
  for (int64_t i = 0; i < batch; ++i) {  // items checked by the codec
    uint32_t size = 0;
    std::memcpy(&size, texts.data.data() + offset, 4);
    offset += 4;
    const std::string_view text(texts.data.data() + offset, size);
    offset += size;
    const Status status = tokenizer_->Encode(text, out[0].data_as<int64_t>() + i * len);
    if (!status.ok()) {
      return InvalidArgument("input '" + texts.name + "' item " + std::to_string(i) +
                             ": " + status.message());
    }
  }
  return out;
}

Status Model::Submit(std::vector<Tensor> inputs, Clock::time_point deadline,
                     InferJob::Callback done, std::shared_ptr<InferJob>* job) {
  if (!ready()) return Unavailable("model '" + name_ + "' is not ready");
  if (inputs.size() == 1 && inputs[0].dtype == DataType::kBytes) {
    if (!tokenizer_) {
      return InvalidArgument("model '" + name_ + "' takes no text input");
    }
    ASSIGN_OR_RETURN(inputs, Tokenize(inputs[0]));
  }
  *job = std::make_shared<InferJob>(std::move(inputs), deadline,
                                    std::move(done));
  return batcher_->Enqueue(*job);
}

void Model::SetPredictionLog(PredictionLog* log) { log_ = log; }

void Model::Summarize(const StatusOr<std::vector<Tensor>>& result,
                      PredictionRecord* record) const {
  if (!result.ok()) {
    record->code = HttpStatusFor(result.status().code());
    record->error = result.status().message();
    return;
  }
  if (result->empty()) return;
  const Tensor& out = result->front();
  if (out.dtype != DataType::kFp32 || out.shape.empty()) return;
  const int64_t batch = out.shape[0];
  if (batch <= 0) return;
  const int64_t per_item =
      static_cast<int64_t>(out.byte_size() / sizeof(float)) / batch;
  const float* data = out.data_as<float>();
  if (out.shape.size() == 2 && per_item > 1) {
    // a classifier: top-1 and its softmax probability (logits or probs)
    record->top1.reserve(batch);
    record->confidence.reserve(batch);
    for (int64_t i = 0; i < batch; ++i) {
      const float* row = data + i * per_item;
      int64_t best = 0;
      for (int64_t c = 1; c < per_item; ++c) {
        if (row[c] > row[best]) best = c;
      }
      double sum = 0.0;
      for (int64_t c = 0; c < per_item; ++c) sum += std::exp(row[c] - row[best]);
      record->top1.push_back(best);
      record->confidence.push_back(static_cast<float>(1.0 / sum));
    }
    return;
  }
  record->output_mean.reserve(batch);
  for (int64_t i = 0; i < batch; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < per_item; ++j) sum += data[i * per_item + j];
    record->output_mean.push_back(
        static_cast<float>(per_item > 0 ? sum / per_item : 0.0));
  }
}

void Model::InferAsync(std::vector<Tensor> inputs, Clock::time_point deadline,
                       InferJob::Callback done, const LogContext& context) {
  // `done` is shared so that it can still be called if Submit fails after
  // handing it to a job that never ran.
  auto shared = std::make_shared<InferJob::Callback>(std::move(done));
  InferJob::Callback callback;
  if (log_ == nullptr) {
    callback = [shared](StatusOr<std::vector<Tensor>> result) {
      (*shared)(std::move(result));
    };
  } else {
    auto record = std::make_shared<PredictionRecord>();
    record->id = context.id.empty() ? NewRequestId() : context.id;
    record->model = name_;
    record->version = version_;
    record->role = context.role;
    record->answered = context.answered;
    record->time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    record->batch = inputs.empty() || inputs[0].shape.empty() ? 0 : inputs[0].shape[0];
    const double rate = config_.log_input_rate;
    if (rate > 0.0) {
      thread_local std::mt19937_64 rng{std::random_device{}()};
      if (rate >= 1.0 || std::uniform_real_distribution<double>(0.0, 1.0)(rng) < rate) {
        record->inputs = inputs;  // a copy: the request's own move on
      }
    }
    const auto start = Clock::now();
    callback = [this, shared, record, start](StatusOr<std::vector<Tensor>> result) {
      record->latency_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               Clock::now() - start)
                               .count();
      Summarize(result, record.get());
      PredictionLog* log = log_;
      (*shared)(std::move(result));  // the client first
      log->Submit(std::move(*record));
    };
  }
  std::shared_ptr<InferJob> job;
  const Status status = Submit(std::move(inputs), deadline, callback, &job);
  if (!status.ok()) callback(status);
}

void Model::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (batcher_) batcher_->Stop();
}

size_t Model::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batcher_ ? batcher_->pending() : 0;
}

size_t Model::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batcher_ ? batcher_->queue_depth() : 0;
}

std::string Model::platform() const {
  return PlatformName(backend_options_);
}

nlohmann::json Model::Metadata() const {
  nlohmann::json out = {{"name", name_},
                        {"versions", nlohmann::json::array({version_})},
                        {"platform", platform()},
                        {"inputs", SpecsJson(io_.inputs)},
                        {"outputs", SpecsJson(io_.outputs)}};
  if (!io_.text_inputs.empty()) {
    // extension: what a client may send instead of "inputs" (raw UTF-8 text)
    out["text_inputs"] = SpecsJson(io_.text_inputs);
  }
  return out;
}

nlohmann::json Model::Config() const {
  nlohmann::json out = {{"name", name_}, {"version", version_}};
  nlohmann::json settings = PerModelJson(config_);
  // what the batcher really uses (a fixed-batch program raises the limit)
  settings["max_batch_size"] = batcher_options_.max_batch_size;
  out["settings"] = std::move(settings);
  const std::string file = config_.model_dir + "/" + kModelConfigFile;
  out["model_config_file"] =
      std::ifstream(file).good() ? nlohmann::json(file) : nlohmann::json();
  return out;
}

}  // namespace serving

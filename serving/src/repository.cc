#include "repository.h"

#include <sstream>

#include <random>
#include <utility>

#include "logging.h"
#include "metrics.h"

namespace serving {
namespace {

using json = nlohmann::json;

// The load parameters a client may set, and where they go.
const std::vector<std::pair<std::string, std::string ServerConfig::*>>&
LoadKeys() {
  static const std::vector<std::pair<std::string, std::string ServerConfig::*>>
      keys = {{"model_dir", &ServerConfig::model_dir},
              {"version", &ServerConfig::model_version},
              {"variant", &ServerConfig::variant},
              {"model_file", &ServerConfig::model_file},
              {"params_file", &ServerConfig::params_file}};
  return keys;
}

std::string LoadKeyList() {
  std::string out;
  for (const auto& [key, member] : LoadKeys()) {
    out += (out.empty() ? "" : ", ") + key;
  }
  return out + ", config";
}

Status ApplyKey(const std::string& key, const json& value, ServerConfig* c) {
  for (const auto& [name, member] : LoadKeys()) {
    if (name != key) continue;
    if (!value.is_string()) {
      return InvalidArgument("load parameter '" + key + "' must be a string");
    }
    c->*member = value.get<std::string>();
    return Status::Ok();
  }
  return InvalidArgument("unknown load parameter '" + key +
                         "'; allowed: " + LoadKeyList());
}

json Entry(const std::string& name, const std::string& version,
           const std::string& state, const std::string& reason) {
  return {{"name", name}, {"version", version}, {"state", state},
          {"reason", reason}};
}

// "role", "policy" and "fraction" of a load's parameters (removed from them).
Status TakeRole(json* parameters, bool* challenger, TrafficPolicy* policy) {
  *challenger = false;
  if (!parameters->is_object()) return Status::Ok();
  auto take = [&](const char* key, std::string* out) -> Status {
    const auto it = parameters->find(key);
    if (it == parameters->end()) return Status::Ok();
    if (!it->is_string()) {
      return InvalidArgument(std::string("load parameter '") + key + "' must be a string");
    }
    *out = it->get<std::string>();
    parameters->erase(it);
    return Status::Ok();
  };
  std::string role, mode, fraction;
  RETURN_IF_ERROR(take("role", &role));
  RETURN_IF_ERROR(take("policy", &mode));
  RETURN_IF_ERROR(take("fraction", &fraction));
  if (role.empty() || role == "champion") {
    if (!mode.empty() || !fraction.empty()) {
      return InvalidArgument("load parameters 'policy' and 'fraction' need \"role\": \"challenger\"");
    }
    return Status::Ok();
  }
  if (role != "challenger") {
    return InvalidArgument("load parameter 'role' must be champion or challenger, got '" + role + "'");
  }
  if (mode != "shadow" && mode != "canary") {
    return InvalidArgument("a challenger needs load parameter 'policy': shadow or canary");
  }
  char* end = nullptr;
  const double f = std::strtod(fraction.c_str(), &end);
  if (fraction.empty() || end != fraction.c_str() + fraction.size() || !(f > 0.0 && f <= 1.0)) {
    return InvalidArgument("load parameter 'fraction' must be a number in (0, 1], got '" +
                           fraction + "'");
  }
  *challenger = true;
  policy->mode = mode;
  policy->fraction = f;
  return Status::Ok();
}

bool Draw(double fraction) {
  if (fraction >= 1.0) return true;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < fraction;
}

}  // namespace

void StartShadow(const Routed& routed, const std::vector<Tensor>& inputs,
                 Clock::time_point deadline, LogContext* context) {
  if (!routed.shadow) return;
  if (context->id.empty()) context->id = NewRequestId();
  routed.shadow->InferAsync(inputs, deadline, [](StatusOr<std::vector<Tensor>>) {},
                            LogContext{context->id, routed.shadow_role, false});
}

ModelRepository::ModelRepository(ServerConfig config, BackendFactory factory,
                                 Registry* registry)
    : config_(std::move(config)),
      factory_(std::move(factory)),
      registry_(registry) {}

ModelRepository::~ModelRepository() {
  StopAll();
}

Status ModelRepository::Prepare() {
  ASSIGN_OR_RETURN(auto model, Model::Create(config_, factory_));
  if (!config_.prediction_log_dir.empty() && !log_) {
    PredictionLogOptions options;
    options.dir = config_.prediction_log_dir;
    options.max_bytes = config_.prediction_log_max_bytes;
    options.segment_bytes = config_.prediction_log_segment_bytes;
    options.queue_size = config_.prediction_log_queue_size;
    options.sink_url = config_.prediction_log_sink;
    ASSIGN_OR_RETURN(log_, PredictionLog::Open(options, registry_));
  }
  model->SetPredictionLog(log_.get());
  std::lock_guard<std::mutex> lock(mu_);
  name_ = model->name();
  prepared_ = std::shared_ptr<Model>(std::move(model));
  metrics_.push_back(std::make_unique<ServingMetrics>(
      registry_, name_, prepared_->version(),
      prepared_->backend_options().max_batch_size));
  server_metrics_ = metrics_.back().get();
  server_metrics_->SetReady(false);
  return Status::Ok();
}

Status ModelRepository::Compile(const std::shared_ptr<Model>& model,
                                ServingMetrics* metrics) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    loading_version_ = model->version();
  }
  const Status status = model->Load(metrics);
  std::lock_guard<std::mutex> lock(mu_);
  loading_version_.clear();
  // A version that never served leaves no entry: the index lists what
  // serves, drains or drained (the load's answer and the log say why).
  if (!status.ok()) return status;
  Model* raw = model.get();
  metrics->SetQueueDepthCallback(
      [raw] { return static_cast<double>(raw->queue_depth()); });
  return Status::Ok();
}

Status ModelRepository::LoadPrepared() {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::shared_ptr<Model> model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    model = std::move(prepared_);
    if (!model) return Internal("no prepared model");
  }
  RETURN_IF_ERROR(Compile(model, server_metrics_));
  std::lock_guard<std::mutex> lock(mu_);
  server_metrics_->SetReady(true);
  current_ = std::move(model);
  return Status::Ok();
}

Status ModelRepository::KnownName(const std::string& name) const {
  if (name == name_) return Status::Ok();
  return NotFound("unknown model '" + name + "'; this server serves '" +
                  name_ + "'");
}

Status ModelRepository::ControlAllowed(const std::string& name) const {
  if (!config_.model_control) {
    return InvalidArgument(
        "model control is disabled: start the server with "
        "--model-control=true to load and unload models");
  }
  return KnownName(name);
}

StatusOr<std::shared_ptr<Model>> ModelRepository::Find(
    const std::string& name, const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(KnownName(name));
  if (!current_) {
    return Unavailable("model '" + name + "' is not loaded");
  }
  if (challenger_ && !version.empty() && version == challenger_->version() &&
      version != current_->version()) {
    return challenger_;
  }
  if (!version.empty() && version != current_->version()) {
    return NotFound("unknown version '" + version + "' of model '" + name +
                    "'; available: " + current_->version() +
                    (challenger_ ? ", " + challenger_->version() : ""));
  }
  return current_;
}

StatusOr<Routed> ModelRepository::Route(const std::string& name,
                                        const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(KnownName(name));
  if (!current_) return Unavailable("model '" + name + "' is not loaded");
  Routed out;
  if (!challenger_) {
    if (!version.empty() && version != current_->version()) {
      return NotFound("unknown version '" + version + "' of model '" + name +
                      "'; available: " + current_->version());
    }
    out.answer = current_;
    return out;
  }
  if (!version.empty()) {  // an explicit version: that one, no policy
    if (version == current_->version()) {
      out.answer = current_;
      out.role = "champion";
    } else if (version == challenger_->version()) {
      out.answer = challenger_;
      out.role = "challenger";
    } else {
      return NotFound("unknown version '" + version + "' of model '" + name +
                      "'; available: " + current_->version() + ", " +
                      challenger_->version());
    }
    return out;
  }
  const bool drawn = Draw(policy_.fraction);
  if (policy_.mode == "canary" && drawn) {
    out.answer = challenger_;
    out.role = "challenger";
    out.shadow = current_;
    out.shadow_role = "champion";
  } else {
    out.answer = current_;
    out.role = "champion";
    if (policy_.mode == "shadow" && drawn) {
      out.shadow = challenger_;
      out.shadow_role = "challenger";
    }
  }
  return out;
}

TrafficPolicy ModelRepository::policy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_;
}

bool ModelRepository::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_ && current_->ready();
}

size_t ModelRepository::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_ ? current_->queue_depth() : 0;
}

StatusOr<ServerConfig> ModelRepository::Overrides(
    const json& parameters) const {
  ServerConfig config = config_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_) config.model_version = current_->version();
  }
  if (parameters.is_null()) return config;
  if (!parameters.is_object()) {
    return InvalidArgument("load \"parameters\" must be an object");
  }
  for (const auto& [key, value] : parameters.items()) {
    if (key == "config") {
      // Triton's form: the configuration as a JSON string.
      if (!value.is_string()) {
        return InvalidArgument("load parameter 'config' must be a string");
      }
      const json parsed = json::parse(value.get<std::string>(), nullptr,
                                      /*allow_exceptions=*/false);
      if (!parsed.is_object()) {
        return InvalidArgument(
            "load parameter 'config' must hold a JSON object");
      }
      for (const auto& [k, v] : parsed.items()) {
        RETURN_IF_ERROR(ApplyKey(k, v, &config));
      }
    } else {
      RETURN_IF_ERROR(ApplyKey(key, value, &config));
    }
  }
  return config;
}

StatusOr<std::shared_ptr<Model>> ModelRepository::Build(
    const ServerConfig& config) {
  ASSIGN_OR_RETURN(auto created, Model::Create(config, factory_));
  std::shared_ptr<Model> model(std::move(created));
  model->SetPredictionLog(log_.get());
  ServingMetrics* metrics = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (model->name() != name_) {
      return InvalidArgument("the loaded model is named '" + model->name() +
                             "' but this server serves '" + name_ + "'");
    }
    metrics_.push_back(std::make_unique<ServingMetrics>(
        registry_, name_, model->version(),
        model->backend_options().max_batch_size));
    metrics = metrics_.back().get();
  }
  RETURN_IF_ERROR(Compile(model, metrics));
  return model;
}

Status ModelRepository::Load(const std::string& name,
                             const json& given) {
  RETURN_IF_ERROR(ControlAllowed(name));
  return LoadUnchecked(given);
}

Status ModelRepository::LoadConfiguredChallenger() {
  if (config_.challenger_model_dir.empty()) return Status::Ok();
  if (config_.challenger_version.empty()) {
    return InvalidArgument("--challenger-model-dir needs --challenger-version");
  }
  std::ostringstream fraction;
  fraction << config_.challenger_fraction;
  return LoadUnchecked(json{{"model_dir", config_.challenger_model_dir},
                            {"version", config_.challenger_version},
                            {"variant", config_.variant},
                            {"role", "challenger"},
                            {"policy", config_.challenger_policy},
                            {"fraction", fraction.str()}});
}

Status ModelRepository::LoadUnchecked(const json& given) {
  json parameters = given;
  bool as_challenger = false;
  TrafficPolicy policy;
  RETURN_IF_ERROR(TakeRole(&parameters, &as_challenger, &policy));
  ASSIGN_OR_RETURN(ServerConfig config, Overrides(parameters));
  config.model_name = name_;
  std::lock_guard<std::mutex> load_lock(load_mu_);
  LogInfo("loading model", {{"model", name_},
                            {"version", config.model_version},
                            {"model_dir", config.model_dir},
                            {"variant", config.variant}});
  if (as_challenger) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_) {
      return InvalidArgument("a challenger needs a current version to run beside");
    }
    if (config.model_version == current_->version()) {
      return InvalidArgument("the challenger's version must differ from the current one (" +
                             current_->version() + ")");
    }
  }
  auto built = Build(config);
  if (!built.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    LogWarn("model load failed",
            {{"model", name_},
             {"version", config.model_version},
             {"model_dir", config.model_dir},
             {"error", built.status().message()},
             {"serving", current_ ? json(current_->version()) : json()}});
    return built.status();
  }
  std::shared_ptr<Model> model = std::move(built).value();
  std::lock_guard<std::mutex> lock(mu_);
  if (as_challenger) {
    if (challenger_) RetireLocked(std::move(challenger_), "replaced by challenger " + model->version());
    model->metrics()->SetReady(true);
    challenger_ = std::move(model);
    policy_ = policy;
    LogInfo("challenger loaded", {{"model", name_}, {"version", challenger_->version()},
                                  {"policy", policy_.mode}, {"fraction", policy_.fraction}});
    return Status::Ok();
  }
  if (current_) RetireCurrentLocked("replaced by version " + model->version());
  // Drop stale entries of the version being (re)loaded.
  for (auto it = history_.begin(); it != history_.end();) {
    if (it->model->version() == model->version() &&
        it->state != "UNLOADING") {
      it = history_.erase(it);
    } else {
      ++it;
    }
  }
  model->metrics()->SetReady(true);
  current_ = std::move(model);
  LogInfo("model version swapped in",
          {{"model", name_}, {"version", current_->version()}});
  return Status::Ok();
}

Status ModelRepository::Unload(const std::string& name, const json& parameters) {
  RETURN_IF_ERROR(ControlAllowed(name));
  std::string role;
  if (parameters.is_object()) {
    for (const auto& [key, value] : parameters.items()) {
      if (key == "unload_dependents") continue;  // Triton's; nothing depends here
      if (key != "role" || !value.is_string()) {
        return InvalidArgument(
            "unload takes the string parameter 'role' (challenger) and "
            "'unload_dependents' only");
      }
      role = value.get<std::string>();
    }
  }
  if (!role.empty() && role != "challenger") {
    return InvalidArgument("unload parameter 'role' must be challenger, got '" + role + "'");
  }
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  if (role == "challenger") {
    if (!challenger_) return NotFound("model '" + name_ + "' has no challenger");
    LogInfo("challenger unloaded", {{"model", name_}, {"version", challenger_->version()}});
    RetireLocked(std::move(challenger_), "challenger unloaded");
    policy_ = TrafficPolicy();
    return Status::Ok();
  }
  if (current_) RetireCurrentLocked("unloaded");
  if (challenger_) RetireLocked(std::move(challenger_), "unloaded");
  policy_ = TrafficPolicy();
  return Status::Ok();
}

Status ModelRepository::Promote(const std::string& name) {
  RETURN_IF_ERROR(ControlAllowed(name));
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!challenger_) return NotFound("model '" + name_ + "' has no challenger to promote");
  const std::string version = challenger_->version();
  if (current_) RetireCurrentLocked("replaced by challenger " + version);
  current_ = std::move(challenger_);
  policy_ = TrafficPolicy();
  LogInfo("challenger promoted", {{"model", name_}, {"version", version}});
  return Status::Ok();
}

void ModelRepository::RetireCurrentLocked(const std::string& reason) {
  std::shared_ptr<Model> old = std::move(current_);
  current_.reset();
  RetireLocked(std::move(old), reason);
}

void ModelRepository::RetireLocked(std::shared_ptr<Model> old, const std::string& reason) {
  if (old->metrics() != nullptr) old->metrics()->SetReady(false);
  history_.push_back({old, "UNLOADING", reason});
  // Drain off every request thread: Stop() runs what is queued and joins
  // the workers; only then does the version count as unavailable.
  drainers_.emplace_back([this, old, reason] {
    old->Stop();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : history_) {
      if (entry.model == old) entry.state = "UNAVAILABLE";
    }
    LogInfo("model version drained",
            {{"model", name_}, {"version", old->version()},
             {"reason", reason}});
  });
}

json ModelRepository::Index(bool ready_only) const {
  std::lock_guard<std::mutex> lock(mu_);
  json out = json::array();
  if (current_) out.push_back(Entry(name_, current_->version(), "READY", ""));
  if (challenger_) {
    out.push_back(Entry(name_, challenger_->version(), "READY",
                        "challenger (" + policy_.mode + " " +
                            std::to_string(policy_.fraction) + ")"));
  }
  if (ready_only) return out;
  if (!loading_version_.empty()) {
    out.push_back(Entry(name_, loading_version_, "LOADING", ""));
  }
  for (const auto& entry : history_) {
    out.push_back(
        Entry(name_, entry.model->version(), entry.state, entry.reason));
  }
  return out;
}

StatusOr<json> ModelRepository::Statistics(const std::string& name,
                                           const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!name.empty()) RETURN_IF_ERROR(KnownName(name));
  json stats = json::array();
  auto add = [&](const Model& model) {
    if (!version.empty() && model.version() != version) return;
    for (const auto& done : stats) {
      if (done["version"] == model.version()) return;  // reloaded version
    }
    stats.push_back(model.stats().Json(name_, model.version()));
  };
  if (current_) add(*current_);
  if (challenger_) add(*challenger_);
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    add(*it->model);
  }
  if (stats.empty() && !version.empty()) {
    return NotFound("no statistics for version '" + version +
                    "' of model '" + name_ + "'");
  }
  return json{{"model_stats", stats}};
}

void ModelRepository::StopAll() {
  std::shared_ptr<Model> current, challenger;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current = current_;
    challenger = challenger_;
  }
  if (current) current->Stop();
  if (challenger) challenger->Stop();
  std::vector<std::thread> drainers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drainers.swap(drainers_);
  }
  for (auto& t : drainers) {
    if (t.joinable()) t.join();
  }
}

}  // namespace serving

// The served model's versions, in the shape of Triton's model repository
// extension: index, load (build a version while the current one keeps
// serving, then swap it in; the old version drains what it queued) and
// unload, plus per-version statistics.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "model.h"
#include "prediction_log.h"
#include "status.h"

namespace serving {

class Registry;
class ServingMetrics;

// How requests are shared between the champion (the current version) and a
// challenger loaded beside it: "shadow" also runs `fraction` of the requests
// on the challenger (clients get the champion's answer only); "canary" lets
// the challenger answer `fraction` of them. Both answers are logged under the
// request's id (prediction_log.h).
struct TrafficPolicy {
  std::string mode = "none";  // none | shadow | canary
  double fraction = 0.0;
};

// Which version answers a request, and which (if any) shadows it: under
// shadow the challenger shadows the champion's sampled requests; under canary
// the champion shadows the requests the challenger answers, so every request
// a challenger saw has both answers (paired evidence for the judge).
struct Routed {
  std::shared_ptr<Model> answer;
  std::string role;  // "" (one version served), "champion" or "challenger"
  std::shared_ptr<Model> shadow;  // nullptr: none
  std::string shadow_role;
};

// Runs `routed`'s shadow version (if any) on a copy of `inputs`, its answer only
// logged, under `context`'s id (a new one when empty, then set in `context` so the
// answering version logs under it too).
void StartShadow(const Routed& routed, const std::vector<Tensor>& inputs,
                 Clock::time_point deadline, LogContext* context);

class ModelRepository {
 public:
  // `config` describes the initial model; `registry` (metrics) must outlive
  // the repository.
  ModelRepository(ServerConfig config, BackendFactory factory,
                  Registry* registry);
  ~ModelRepository();

  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  // Reads signature.json of the configured model (fast; errors: bad files).
  Status Prepare();
  // Builds and starts the prepared model (compiles it; slow).
  Status LoadPrepared();

  // The served version of `name` ("" version: whichever is current).
  // NotFound for another name or version, Unavailable when not loaded.
  StatusOr<std::shared_ptr<Model>> Find(const std::string& name,
                                        const std::string& version) const;

  // The version(s) a request for `name` [and `version`] runs on, under the
  // traffic policy (an explicit version: that one alone).
  StatusOr<Routed> Route(const std::string& name,
                         const std::string& version) const;

  // Loads `name` with `parameters` (strings: model_dir, version, variant,
  // model_file, params_file; "config": a JSON object string with the same
  // keys) over the server's configuration. With "role": "challenger" the
  // version is loaded beside the current one under "policy" (shadow | canary)
  // and "fraction" (0 < f <= 1) instead of replacing it. The current version serves until
  // the new one is ready, then drains. Blocking and serialized: call it off
  // the I/O threads. InvalidArgument for unknown keys or a disabled
  // --model-control, NotFound for another model name.
  Status Load(const std::string& name, const nlohmann::json& parameters);
  // The challenger of the command line (--challenger-model-dir and the rest),
  // loaded as Load with "role": "challenger" would, whatever --model-control
  // says: a Kubernetes pod gets both versions at start. Nothing configured:
  // Ok, nothing loaded.
  Status LoadConfiguredChallenger();
  // Stops serving `name`; its queued and running requests still finish.
  // With "role": "challenger" in `parameters`: only the challenger (a
  // rollback: the champion alone serves again).
  Status Unload(const std::string& name, const nlohmann::json& parameters = {});
  // The challenger becomes the current version (the old one drains).
  Status Promote(const std::string& name);
  TrafficPolicy policy() const;

  // [{name, version, state, reason}] (state READY | LOADING | UNLOADING |
  // UNAVAILABLE); `ready_only` keeps the READY ones.
  nlohmann::json Index(bool ready_only) const;
  // {"model_stats": [...]} for every version still known, or for `name`
  // [and `version`]; NotFound when nothing matches.
  StatusOr<nlohmann::json> Statistics(const std::string& name,
                                      const std::string& version) const;

  // The name clients use (the configured one) and whether it is served.
  const std::string& name() const { return name_; }
  bool ready() const;
  // Queue depth of the current version (0 when none).
  size_t queue_depth() const;
  // Metrics of the first version: server-wide instruments (HTTP counters).
  ServingMetrics* server_metrics() const { return server_metrics_; }

  // Stops every version (draining) and waits for retired ones.
  void StopAll();

  // The prediction log (nullptr without --prediction-log-dir).
  PredictionLog* prediction_log() const { return log_.get(); }

 private:
  struct Version {
    std::shared_ptr<Model> model;
    std::string state;  // READY | UNLOADING | UNAVAILABLE
    std::string reason;
  };
  StatusOr<ServerConfig> Overrides(const nlohmann::json& parameters) const;
  // Builds `model`'s backend and batcher; a failure leaves no history entry
  // (the version never served).
  Status Compile(const std::shared_ptr<Model>& model, ServingMetrics* metrics);
  Status KnownName(const std::string& name) const;
  // --model-control is on and `name` is served.
  Status ControlAllowed(const std::string& name) const;
  Status LoadUnchecked(const nlohmann::json& parameters);
  StatusOr<std::shared_ptr<Model>> Build(const ServerConfig& config);
  // Moves the current version to the retired list and drains it in the
  // background. Under mu_.
  void RetireCurrentLocked(const std::string& reason);
  void RetireLocked(std::shared_ptr<Model> old, const std::string& reason);

  const ServerConfig config_;
  const BackendFactory factory_;
  Registry* const registry_;
  // Before every model member: destroyed after them (they log into it).
  std::unique_ptr<PredictionLog> log_;
  std::string name_;
  ServingMetrics* server_metrics_ = nullptr;

  std::mutex load_mu_;  // one load/unload at a time
  mutable std::mutex mu_;
  std::shared_ptr<Model> prepared_;  // between Prepare and LoadPrepared
  std::shared_ptr<Model> current_;
  std::shared_ptr<Model> challenger_;  // beside current_, under policy_
  TrafficPolicy policy_;
  std::string loading_version_;      // non-empty while a load runs
  std::vector<Version> history_;     // retired versions
  std::vector<std::unique_ptr<ServingMetrics>> metrics_;  // never shrinks
  std::vector<std::thread> drainers_;
};

}  // namespace serving

#include "http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "codec.h"
#include "logging.h"
#include "metrics.h"
#include "model.h"

namespace serving {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kHeaderLength[] = "Inference-Header-Content-Length";
constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

// Start of the request being handled on this HTTP thread (set before routing,
// read by the access logger after the response is written).
thread_local std::optional<Clock::time_point> t_request_start;

void ReplyJson(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void ReplyError(httplib::Response& res, const Status& status) {
  ReplyJson(res, HttpStatusFor(status.code()), ErrorBody(status.message()));
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "not found";
    case 405:
      return "method not allowed";
    case 408:
      return "request timeout";
    case 413:
      return "payload too large";
    case 414:
      return "URI too long";
    case 415:
      return "unsupported media type";
    case 416:
      return "range not satisfiable";
    default:
      return status >= 500 ? "internal server error" : "request failed";
  }
}

bool IsInferPath(const std::string& path) {
  static const std::string kSuffix = "/infer";
  return path.rfind("/v2/models/", 0) == 0 && path.size() >= kSuffix.size() &&
         path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) ==
             0;
}

// Worker threads, body limit, keep-alive and socket options.
void ConfigureTransport(httplib::Server& svr, const HttpOptions& options) {
  const size_t threads = static_cast<size_t>(options.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  svr.set_keep_alive_max_count(
      static_cast<size_t>(options.keep_alive_max_count));
  svr.set_keep_alive_timeout(options.keep_alive_timeout_s);
  svr.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets
  // a second server bind the same port and silently share its traffic.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

// Timing starts before routing; `draining` closes connections after routing.
void InstallRoutingHooks(httplib::Server& svr,
                         const std::atomic<bool>* draining) {
  // While draining, ask clients to reconnect (elsewhere) after this response.
  svr.set_post_routing_handler(
      [draining](const httplib::Request&, httplib::Response& res) {
        if (*draining) res.set_header("Connection", "close");
      });

  svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_request_start = Clock::now();
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

// The {"error": ...} message for an error response that has no body yet.
std::string BodylessErrorMessage(const httplib::Request& req,
                                 const httplib::Response& res,
                                 int64_t max_body) {
  if (res.status == 413) {
    return "request body exceeds the limit of " + std::to_string(max_body) +
           " bytes (--max-body-bytes)";
  }
  if (res.status == 404) return "no endpoint " + req.method + " " + req.path;
  return std::string(ReasonPhrase(res.status));
}

// Errors without a body (no route, 413 from the body limit, ...) get the
// protocol's {"error": ...} body; handler errors keep theirs.
void InstallErrorHandlers(httplib::Server& svr, int64_t max_body) {
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty())
          return httplib::Server::HandlerResponse::Unhandled;
        res.set_content(ErrorBody(BodylessErrorMessage(req, res, max_body)),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));

  // Expect: 100-continue with a body over the limit: refuse before the
  // client uploads it.
  svr.set_expect_100_continue_handler(
      [max_body](const httplib::Request& req, httplib::Response& res) {
        const std::string length = req.get_header_value("Content-Length");
        if (!length.empty() && std::strtoull(length.c_str(), nullptr, 10) >
                                   static_cast<unsigned long long>(max_body)) {
          res.status = 413;
          res.set_header("Connection", "close");
          return 413;
        }
        return 100;
      });
}

// A handler that throws answers 500 with the exception's message.
void InstallExceptionHandler(httplib::Server& svr) {
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                               std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LogError("unhandled exception in handler", {{"error", what}});
    ReplyJson(res, 500, ErrorBody("internal error: " + what));
  });
}

// After each response: request metrics and (optionally) the access log line.
void InstallLogger(httplib::Server& svr, ServingMetrics* metrics,
                   bool access_log) {
  svr.set_logger([metrics, access_log](const httplib::Request& req,
                                       const httplib::Response& res) {
    double seconds = 0.0;
    if (t_request_start.has_value()) {
      seconds = std::chrono::duration<double>(Clock::now() - *t_request_start)
                    .count();
      t_request_start.reset();
    }
    metrics->RecordHttpRequest(req.method, res.status);
    if (req.method == "POST" && IsInferPath(req.path)) {
      metrics->RecordInferRequest(res.status, seconds);
    }
    if (access_log) {
      LogInfo("access", {{"method", req.method},
                         {"path", req.path},
                         {"status", res.status},
                         {"ms", std::round(seconds * 1e6) / 1e3},
                         {"remote", req.remote_addr},
                         {"bytes_in", req.body.size()},
                         {"bytes_out", res.body.size()}});
    }
  });
}

// GET /v2/health/live, /v2/health/ready, /v2, /v2/ and /metrics.
void RegisterServerRoutes(httplib::Server& svr, const Model* model,
                          const Registry* registry,
                          const std::atomic<bool>* draining) {
  svr.Get("/v2/health/live",
          [](const httplib::Request&, httplib::Response& res) {
            ReplyJson(res, 200, R"({"live":true})");
          });

  svr.Get("/v2/health/ready",
          [model, draining](const httplib::Request&, httplib::Response& res) {
            const bool ready = model->ready() && !*draining;
            ReplyJson(res, ready ? 200 : 503,
                      ready ? R"({"ready":true})" : R"({"ready":false})");
          });

  auto server_metadata = [](const httplib::Request&, httplib::Response& res) {
    const json meta = {
        {"name", kServerName},
        {"version", kServerVersion},
        {"extensions", json::array({"binary_tensor_data", "classification"})}};
    ReplyJson(res, 200, meta.dump());
  };
  svr.Get("/v2", server_metadata);
  svr.Get("/v2/", server_metadata);

  svr.Get("/metrics",
          [registry](const httplib::Request&, httplib::Response& res) {
            res.status = 200;
            res.set_content(registry->Render(), "text/plain; version=0.0.4");
          });
}

// Resolves {name}[/versions/{v}] of a model route against the served model.
Status FindModel(const httplib::Request& req, const Model& model) {
  const std::string name = req.matches[1].str();
  const std::string version =
      req.matches.size() > 2 ? req.matches[2].str() : std::string();
  if (name != model.name()) {
    return NotFound("unknown model '" + name + "'; this server serves '" +
                    model.name() + "'");
  }
  if (!version.empty() && version != model.version()) {
    return NotFound("unknown version '" + version + "' of model '" + name +
                    "'; available: " + model.version());
  }
  return Status::Ok();
}

// Counts a request as in flight for its lifetime.
class InflightGuard {
 public:
  explicit InflightGuard(ServingMetrics* metrics) : metrics_(metrics) {
    metrics_->AddInflight(1);
  }
  ~InflightGuard() { metrics_->AddInflight(-1); }
  InflightGuard(const InflightGuard&) = delete;
  InflightGuard& operator=(const InflightGuard&) = delete;

 private:
  ServingMetrics* const metrics_;
};

// The Inference-Header-Content-Length header, if the request has one.
Status ReadHeaderLength(const httplib::Request& req,
                        std::optional<size_t>* json_length) {
  if (!req.has_header(kHeaderLength)) return Status::Ok();
  ASSIGN_OR_RETURN(*json_length,
                   ParseInferenceHeaderLength(
                       req.get_header_value(kHeaderLength), req.body.size()));
  return Status::Ok();
}

// The timeout runs from enqueue to completion: the server's, or the
// request's "timeout" parameter when that is shorter.
Clock::time_point InferDeadline(int64_t request_timeout_ms,
                                int64_t request_timeout_us) {
  const auto enqueue = Clock::now();
  auto deadline = enqueue + std::chrono::milliseconds(request_timeout_ms);
  if (request_timeout_us > 0) {
    deadline = std::min(
        deadline, enqueue + std::chrono::microseconds(request_timeout_us));
  }
  return deadline;
}

// Parses, runs and encodes one inference request.
StatusOr<EncodedResponse> RunInfer(const httplib::Request& req, Model* model,
                                   int64_t request_timeout_ms) {
  RETURN_IF_ERROR(FindModel(req, *model));
  if (!model->ready()) {
    return Unavailable("model '" + model->name() + "' is not ready");
  }
  std::optional<size_t> json_length;
  RETURN_IF_ERROR(ReadHeaderLength(req, &json_length));
  ASSIGN_OR_RETURN(InferRequest request,
                   ParseInferRequest(req.body, json_length, model->io()));
  const auto deadline = InferDeadline(request_timeout_ms, request.timeout_us);
  ASSIGN_OR_RETURN(const std::vector<Tensor> outputs,
                   model->Infer(std::move(request.inputs), deadline));
  return EncodeInferResponse(model->name(), model->version(), request,
                             outputs, model->io());
}

// POST {model}/infer: 200 with the encoded response, or the error.
void HandleInfer(const httplib::Request& req, httplib::Response& res,
                 Model* model, ServingMetrics* metrics,
                 int64_t request_timeout_ms) {
  const InflightGuard guard(metrics);
  auto encoded = RunInfer(req, model, request_timeout_ms);
  if (!encoded.ok()) return ReplyError(res, encoded.status());
  res.status = 200;
  if (encoded->json_length.has_value()) {
    res.set_header(kHeaderLength, std::to_string(*encoded->json_length));
  }
  res.set_header("Content-Type", encoded->content_type);
  res.body = std::move(encoded->body);
}

// GET {model}, GET {model}/ready and POST {model}/infer, where {model} is
// /v2/models/{name}[/versions/{v}].
void RegisterModelRoutes(httplib::Server& svr, Model* model,
                         ServingMetrics* metrics, int64_t request_timeout_ms) {
  svr.Get(kModelPath, [model](const httplib::Request& req,
                              httplib::Response& res) {
    const Status status = FindModel(req, *model);
    if (!status.ok()) return ReplyError(res, status);
    ReplyJson(res, 200, model->Metadata().dump());
  });

  svr.Get(std::string(kModelPath) + "/ready",
          [model](const httplib::Request& req, httplib::Response& res) {
            const Status status = FindModel(req, *model);
            if (!status.ok()) return ReplyError(res, status);
            const bool ready = model->ready();
            const json body = {{"name", model->name()}, {"ready", ready}};
            ReplyJson(res, ready ? 200 : 503, body.dump());
          });

  svr.Post(std::string(kModelPath) + "/infer",
           [model, metrics, request_timeout_ms](const httplib::Request& req,
                                                httplib::Response& res) {
             HandleInfer(req, res, model, metrics, request_timeout_ms);
           });
}

}  // namespace

HttpServer::HttpServer(const HttpOptions& options, Model* model,
                       Registry* registry, ServingMetrics* metrics)
    : options_(options),
      model_(model),
      registry_(registry),
      metrics_(metrics),
      server_(std::make_unique<httplib::Server>()) {}

HttpServer::~HttpServer() = default;

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(
    const HttpOptions& options, Model* model, Registry* registry,
    ServingMetrics* metrics) {
  if (model == nullptr || registry == nullptr || metrics == nullptr) {
    return InvalidArgument("HTTP server needs a model and metrics");
  }
  if (options.threads < 1)
    return InvalidArgument("--http-threads must be >= 1");
  std::unique_ptr<HttpServer> server(
      new HttpServer(options, model, registry, metrics));
  server->RegisterRoutes();
  return server;
}

Status HttpServer::Bind() {
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
    if (port_ < 0) {
      return Unavailable("cannot bind " + options_.host + " to any port");
    }
  } else {
    if (!server_->bind_to_port(options_.host, options_.port)) {
      return Unavailable("cannot bind " + options_.host + ":" +
                         std::to_string(options_.port) +
                         " (address in use or invalid host)");
    }
    port_ = options_.port;
  }
  return Status::Ok();
}

void HttpServer::Run() {
  run_active_ = true;
  if (!stop_requested_) server_->listen_after_bind();
  run_active_ = false;
}

void HttpServer::Stop() {
  // httplib's stop() is a no-op until the accept loop runs: if Run() is on
  // its way into it, wait for it to get there (or to give up).
  stop_requested_ = true;
  while (run_active_ && !server_->is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
}

void HttpServer::RegisterRoutes() {
  httplib::Server& svr = *server_;
  ConfigureTransport(svr, options_);
  InstallRoutingHooks(svr, &draining_);
  InstallErrorHandlers(svr, options_.max_body_bytes);
  InstallExceptionHandler(svr);
  InstallLogger(svr, metrics_, options_.access_log);
  RegisterServerRoutes(svr, model_, registry_, &draining_);
  RegisterModelRoutes(svr, model_, metrics_, options_.request_timeout_ms);
}

}  // namespace serving

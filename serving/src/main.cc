// paddle-mlops-server: KServe v2 REST and gRPC inference server for an
// exported PaddlePaddle model. Exceptions stop here; everything below returns
// Status.
#include <pthread.h>
#include <sys/resource.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "config.h"
#include "http_server.h"
#include "logging.h"
#include "metrics.h"
#include "model.h"
#include "repository.h"
#ifdef SERVING_WITH_GRPC
#include "grpc_server.h"
#endif

namespace serving {
namespace {

nlohmann::json ConfigJson(const ServerConfig& c) {
  return {{"model_dir", c.model_dir},
          {"variant", c.variant},
          {"model_file", c.model_file},
          {"backend", c.backend},
          {"device", c.device},
          {"precision", c.precision},
          {"cpu_pinning", c.cpu_pinning},
          {"workers", c.workers},
          {"threads_per_worker", c.threads_per_worker},
          {"max_batch_size", c.max_batch_size},
          {"max_queue_delay_us", c.max_queue_delay_us},
          {"dynamic_batching", c.dynamic_batching},
          {"max_queue_size", c.max_queue_size},
          {"request_timeout_ms", c.request_timeout_ms},
          {"model_control", c.model_control},
          {"host", c.host},
          {"port", c.port},
          {"grpc_port", c.grpc_port},
          {"http_threads", c.http_threads},
          {"max_connections", c.max_connections},
          {"header_timeout_ms", c.header_timeout_ms},
          {"body_timeout_ms", c.body_timeout_ms},
          {"keep_alive_timeout_s", c.keep_alive_timeout_s},
          {"max_body_bytes", c.max_body_bytes},
          {"lingering_close_bytes", c.lingering_close_bytes},
          {"lingering_close_ms", c.lingering_close_ms}};
}

int Run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool help = false;
  auto parsed = ParseConfig(
      args, [](const char* n) { return std::getenv(n); }, &help);
  if (help) {
    std::cout << Usage();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << "paddle-mlops-server: " << parsed.status().message()
              << "\n(see --help)\n";
    return 2;
  }
  // The operator's flags and environment; every model version the repository
  // loads applies its own model_config.json under them (Model::Create). The
  // first model's file also sets the HTTP/gRPC request deadline.
  const ServerConfig operator_config = std::move(parsed).value();
  auto applied = ApplyModelConfig(operator_config);
  if (!applied.ok()) {
    std::cerr << "paddle-mlops-server: " << applied.status().message() << "\n";
    return 2;
  }
  const ServerConfig config = std::move(applied).value();
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(config.log_level, &level);
  SetLogLevel(level);

  // SIGTERM/SIGINT are handled by one thread via sigwait; block them before
  // any other thread starts so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client hanging up must not kill the server
  // Connections cost a descriptor each: allow as many as the hard limit.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  Registry registry;
  ModelRepository repository(operator_config, &Backend::Create, &registry);
  if (Status s = repository.Prepare(); !s.ok()) {
    LogError("cannot load model", {{"error", s.message()}});
    return 1;
  }

  HttpOptions http;
  http.host = config.host;
  http.port = config.port;
  http.threads = config.http_threads;
  http.max_connections = config.max_connections;
  http.header_timeout_ms = config.header_timeout_ms;
  http.body_timeout_ms = config.body_timeout_ms;
  http.max_body_bytes = config.max_body_bytes;
  http.lingering_close_bytes = config.lingering_close_bytes;
  http.lingering_close_ms = config.lingering_close_ms;
  http.request_timeout_ms = config.request_timeout_ms;
  http.keep_alive_max_count = config.keep_alive_max_count;
  http.keep_alive_timeout_s = config.keep_alive_timeout_s;
  http.access_log = config.access_log;
  auto server_or = HttpServer::Create(http, &repository, &registry);
  if (!server_or.ok()) {
    LogError("cannot create HTTP server",
             {{"error", server_or.status().message()}});
    return 1;
  }
  std::unique_ptr<HttpServer> server = std::move(server_or).value();
  if (Status s = server->Bind(); !s.ok()) {
    LogError("cannot listen", {{"error", s.message()}});
    return 1;
  }
  int grpc_port = -1;
#ifdef SERVING_WITH_GRPC
  std::unique_ptr<GrpcServer> grpc;
  if (config.grpc_port >= 0) {
    GrpcOptions options;
    options.host = config.host;
    options.port = config.grpc_port;
    options.max_message_bytes = config.max_body_bytes;
    options.request_timeout_ms = config.request_timeout_ms;
    auto grpc_or = GrpcServer::Create(options, &repository);
    Status s = grpc_or.ok() ? Status::Ok() : grpc_or.status();
    if (s.ok()) {
      grpc = std::move(grpc_or).value();
      s = grpc->Start();
    }
    if (!s.ok()) {
      LogError("cannot listen (gRPC)", {{"error", s.message()}});
      return 1;
    }
    grpc_port = grpc->port();
  }
#else
  if (config.grpc_port >= 0) {
    LogWarn("built without gRPC: --grpc-port ignored");
  }
#endif

  // Whoever comes first stops the server: a signal, or the listener dying.
  struct Shutdown {
    std::mutex mu;
    std::condition_variable cv;
    std::string reason;
    void Notify(const std::string& why) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!reason.empty()) return;
        reason = why;
      }
      cv.notify_all();
    }
    std::string Wait() {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] { return !reason.empty(); });
      return reason;
    }
  };
  static Shutdown g_shutdown;  // outlives the detached signal thread

  std::thread signal_thread([signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    LogInfo("shutdown requested", {{"signal", name}});
    g_shutdown.Notify(name);
    sigwait(&signals, &sig);
    LogWarn("second signal: exiting without draining");
    std::_Exit(1);
  });
  signal_thread.detach();

  std::thread http_thread([&server] {
    server->Run();
    g_shutdown.Notify("http listener stopped");
  });
  LogInfo("listening", {{"host", config.host},
                        {"port", server->port()},
                        {"grpc_port", grpc_port},
                        {"model", repository.name()},
                        {"version", config.model_version},
                        {"config", ConfigJson(config)}});

  const auto load_start = std::chrono::steady_clock::now();
  if (Status s = repository.LoadPrepared(); !s.ok()) {
    LogError("cannot load model", {{"error", s.message()}});
    server->Stop();
    http_thread.join();
    return 1;
  }
  if (Status s = repository.LoadConfiguredChallenger(); !s.ok()) {
    LogError("cannot load the challenger", {{"error", s.message()}});
    server->Stop();
    http_thread.join();
    return 1;
  }
  {
    auto model = repository.Find(repository.name(), "");
    LogInfo("model ready",
            {{"model", repository.name()},
             {"version", model.ok() ? (*model)->version() : ""},
             {"platform", model.ok() ? (*model)->platform() : ""},
             {"file",
              model.ok() ? (*model)->backend_options().model_path : ""},
             {"load_ms", std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - load_start)
                             .count()}});
  }

  const std::string reason = g_shutdown.Wait();
  const bool clean = reason == "SIGTERM" || reason == "SIGINT";
  if (!clean) LogError("shutting down", {{"reason", reason}});
  // Drain: readiness fails first, then the listener closes, in-flight and
  // queued requests finish, and the workers stop.
  server->SetDraining();
#ifdef SERVING_WITH_GRPC
  if (grpc) grpc->SetDraining();
#endif
  if (repository.server_metrics() != nullptr) {
    repository.server_metrics()->SetReady(false);
  }
  if (config.drain_delay_ms > 0) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(config.drain_delay_ms));
  }
  server->Stop();
  http_thread.join();
#ifdef SERVING_WITH_GRPC
  if (grpc) grpc->Shutdown(config.request_timeout_ms);
#endif
  repository.StopAll();
  LogInfo("shutdown complete", {{"reason", reason}});
  return clean ? 0 : 1;
}

}  // namespace
}  // namespace serving

int main(int argc, char** argv) {
  try {
    return serving::Run(argc, argv);
  } catch (const std::exception& e) {
    serving::LogError("fatal", {{"error", e.what()}});
    return 1;
  }
}

#include "http_server.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "codec.h"
#include "logging.h"
#include "metrics.h"
#include "model.h"
#include "repository.h"

namespace serving {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Response = http::response<http::string_body>;

namespace {

constexpr char kHeaderLength[] = "Inference-Header-Content-Length";
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
constexpr size_t kReadChunk = 64 * 1024;  // Beast's largest single read
constexpr size_t kIdleBuffer = 8 * 1024;

// A parsed request target: /v2/models/{name}[/versions/{v}][/{action}].
struct ModelRoute {
  std::string name;
  std::string version;
  std::string action;  // "", "ready", "infer", "stats"
};

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 1;
  while (start <= path.size()) {
    const size_t end = path.find('/', start);
    const size_t stop = end == std::string::npos ? path.size() : end;
    parts.push_back(path.substr(start, stop - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

// Matches the model routes; false for any other path.
bool ParseModelRoute(const std::vector<std::string>& parts, ModelRoute* route) {
  if (parts.size() < 3 || parts[0] != "v2" || parts[1] != "models" ||
      parts[2].empty()) {
    return false;
  }
  route->name = parts[2];
  size_t i = 3;
  if (parts.size() >= 5 && parts[3] == "versions") {
    if (parts[4].empty()) return false;
    route->version = parts[4];
    i = 5;
  }
  if (i == parts.size()) return true;
  if (i + 1 == parts.size() &&
      (parts[i] == "ready" || parts[i] == "infer" || parts[i] == "stats" ||
       parts[i] == "config")) {
    route->action = parts[i];
    return true;
  }
  return false;
}

Response MakeResponse(unsigned version, int status, std::string body,
                      const std::string& content_type = "application/json") {
  Response res{static_cast<http::status>(status), version};
  res.set(http::field::server, kServerName);
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  return res;
}

Response ErrorResponse(unsigned version, const Status& status) {
  return MakeResponse(version, HttpStatusFor(status.code()),
                      ErrorBody(status.message()));
}

Response ErrorResponse(unsigned version, int http_status,
                       const std::string& message) {
  return MakeResponse(version, http_status, ErrorBody(message));
}

// The JSON body of a repository call: empty means {}.
StatusOr<json> ParseJsonBody(const std::string& body, const char* what) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    return json::object();
  }
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return InvalidArgument(std::string(what) +
                           " body must be a JSON object");
  }
  return parsed;
}

// Inflates a Content-Encoding gzip or deflate (zlib, or raw as some clients
// send) body into at most `limit` bytes.
StatusOr<std::string> Inflate(const std::string& in, const std::string& coding,
                              int64_t limit) {
  for (const int window : {15 + 32, -15}) {  // gzip/zlib auto-detect, raw
    z_stream zs{};
    if (inflateInit2(&zs, window) != Z_OK) return Internal("zlib init failed");
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    std::string out;
    char chunk[65536];
    int rc = Z_OK;
    while (rc == Z_OK) {
      zs.next_out = reinterpret_cast<Bytef*>(chunk);
      zs.avail_out = sizeof(chunk);
      rc = inflate(&zs, Z_NO_FLUSH);
      out.append(chunk, sizeof(chunk) - zs.avail_out);
      if (static_cast<int64_t>(out.size()) > limit) {
        inflateEnd(&zs);
        return PayloadTooLarge("request body exceeds the limit of " +
                               std::to_string(limit) +
                               " bytes (--max-body-bytes) once decompressed");
      }
      if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;  // truncated
    }
    const bool whole = rc == Z_STREAM_END && zs.avail_in == 0;
    inflateEnd(&zs);
    if (whole) return out;
    if (rc != Z_DATA_ERROR || window < 0 || coding != "deflate") break;
  }
  return InvalidArgument("request body is not valid " + coding +
                         " data (Content-Encoding)");
}

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpOptions& o, ModelRepository* r, Registry* g,
       std::atomic<bool>* d)
      : options(o),
        repository(r),
        registry(g),
        draining(d),
        loops(MakeLoops(o.threads)),
        acceptor(loops[0]->get_executor()),
        control(1) {
    for (size_t i = 1; i < loops.size(); ++i) {
      keep_running.emplace_back(net::make_work_guard(*loops[i]));
    }
  }

  // One single-threaded event loop per I/O thread. A connection lives on
  // one loop for its whole life, so its reads, parsing and writes never
  // wake another I/O thread (with one shared io_context, Asio hands every
  // completed read to whichever thread sits in epoll_wait, a wake-up each).
  static std::vector<std::unique_ptr<net::io_context>> MakeLoops(int n) {
    std::vector<std::unique_ptr<net::io_context>> out;
    for (int i = 0; i < std::max(1, n); ++i) {
      out.push_back(std::make_unique<net::io_context>(1));
    }
    return out;
  }

  class Session;

  void Accept();
  void OnAccept(beast::error_code ec, tcp::socket socket);
  void Reject(tcp::socket socket);
  ServingMetrics* metrics() const { return repository->server_metrics(); }

  const HttpOptions options;
  ModelRepository* const repository;
  Registry* const registry;
  std::atomic<bool>* const draining;

  // Declared before the loops, so they outlive them: destroying a loop
  // destroys the handlers still queued on it (a batch's answer to a request
  // that timed out), and with them the last owners of their sessions.
  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  std::mutex sessions_mu;
  std::set<Session*> sessions;  // open ones: a session removes itself when destroyed

  std::vector<std::unique_ptr<net::io_context>> loops;
  // Loops other than the acceptor's have no work until a connection comes.
  std::vector<net::executor_work_guard<net::io_context::executor_type>>
      keep_running;
  size_t next_loop = 0;  // round-robin; only the acceptor's loop touches it
  tcp::acceptor acceptor;
  net::thread_pool control;  // repository load/unload (slow, blocking)
};

// One connection: reads a request, answers it, and repeats (keep-alive).
// Every handler runs on the connection's event loop (one thread).
class HttpServer::Impl::Session
    : public std::enable_shared_from_this<HttpServer::Impl::Session> {
 public:
  Session(Impl* server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)) {
    beast::error_code ec;
    const auto remote = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = remote.address().to_string();
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  ~Session() {
    {
      std::lock_guard<std::mutex> lock(server_->sessions_mu);
      server_->sessions.erase(this);
    }
    server_->connections.fetch_sub(1);
  }

  void Start() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::Read,
                                            shared_from_this()));
  }

  // Closes the connection if it waits for a request or drains a refused
  // body (Stop()).
  void CloseIfIdle() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_ || self->lingering_) self->Close();
    });
  }

 private:
  void Read() {
    if (server_->stopping) return Close();
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(static_cast<uint64_t>(server_->options.max_body_bytes));
    // The whole header must arrive by this deadline, however it trickles.
    stream_.expires_after(
        served_ == 0
            ? std::chrono::milliseconds(server_->options.header_timeout_ms)
            : std::chrono::milliseconds(
                  server_->options.keep_alive_timeout_s * 1000));
    idle_ = true;
    http::async_read_header(
        stream_, buffer_, *parser_,
        beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  void OnHeader(beast::error_code ec, size_t) {
    idle_ = false;
    if (ec) return OnReadError(ec);
    start_ = Clock::now();
    auto& req = parser_->get();
    const std::string target(req.target());
    path_ = target.substr(0, target.find('?'));
    method_ = std::string(req.method_string());
    const auto length = parser_->content_length();
    const uint64_t max_body =
        static_cast<uint64_t>(server_->options.max_body_bytes);
    if (length && *length > max_body) {
      return RefuseBody(req.version());
    }
    // The body is read in one piece, large bodies 64 KiB at a time: Beast
    // reads at most the buffer's free capacity (at least 512 bytes), so an
    // unreserved buffer would take a 3 KB digits request in 512-byte reads.
    // An idle connection's buffer shrinks again after the answer.
    if (length && *length > 0) {
      buffer_.reserve(buffer_.size() +
                      static_cast<size_t>(std::min<uint64_t>(*length, kReadChunk)));
    }
    // The body (if any) must arrive by this deadline.
    stream_.expires_after(
        std::chrono::milliseconds(server_->options.body_timeout_ms));
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      continue_.emplace(http::status::continue_, req.version());
      return http::async_write(
          stream_, *continue_,
          beast::bind_front_handler(&Session::OnContinue, shared_from_this()));
    }
    ReadBody();
  }

  void OnContinue(beast::error_code ec, size_t) {
    continue_.reset();
    if (ec) return Close();
    ReadBody();
  }

  void ReadBody() {
    http::async_read(
        stream_, buffer_, *parser_,
        beast::bind_front_handler(&Session::OnBody, shared_from_this()));
  }

  void OnBody(beast::error_code ec, size_t) {
    if (ec) return OnReadError(ec);
    stream_.expires_never();  // inference has its own deadline
    request_ = parser_->release();
    const auto coding = request_.find(http::field::content_encoding);
    if (coding != request_.end()) {
      std::string name(coding->value());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (name == "gzip" || name == "deflate") {
        auto inflated = Inflate(request_.body(), name,
                                server_->options.max_body_bytes);
        if (!inflated.ok()) {
          close_after_ = true;
          return Send(ErrorResponse(request_.version(), inflated.status()));
        }
        request_.body() = std::move(inflated).value();
      } else if (name != "identity") {
        return Send(ErrorResponse(request_.version(), 415,
                                  "unsupported Content-Encoding '" + name +
                                      "' (gzip, deflate or identity)"));
      }
    }
    Route();
  }

  void OnReadError(beast::error_code ec) {
    const unsigned version = parser_ ? parser_->get().version() : 11;
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || ec == net::error::eof) {
      return Close();
    }
    if (ec == http::error::body_limit) {
      // Beast checks Content-Length against the limit with the headers.
      const std::string target(parser_->get().target());
      path_ = target.substr(0, target.find('?'));
      method_ = std::string(parser_->get().method_string());
      return RefuseBody(version);
    }
    close_after_ = true;
    if (ec == http::error::header_limit) {
      return Send(ErrorResponse(version, 431,
                                "request headers exceed " +
                                    std::to_string(kMaxHeaderBytes) +
                                    " bytes"));
    }
    Send(ErrorResponse(version, 400, "malformed HTTP request: " + ec.message()));
  }

  // 413, then a lingering close (Linger): the body is not read, but drained.
  void RefuseBody(unsigned version) {
    close_after_ = true;
    linger_ = true;
    Send(ErrorResponse(version, 413,
                       "request body exceeds the limit of " +
                           std::to_string(server_->options.max_body_bytes) +
                           " bytes (--max-body-bytes)"));
  }

  // ---- routing ------------------------------------------------------------
  void Route() {
    const auto& req = request_;
    const unsigned v = req.version();
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    const auto parts = SplitPath(path_);
    ModelRepository& repo = *server_->repository;

    if (path_ == "/v2/health/live") {
      if (!get) return MethodNotAllowed();
      return Send(MakeResponse(v, 200, R"({"live":true})"));
    }
    if (path_ == "/v2/health/ready") {
      if (!get) return MethodNotAllowed();
      const bool ready = repo.ready() && !*server_->draining;
      return Send(MakeResponse(v, ready ? 200 : 503,
                               ready ? R"({"ready":true})"
                                     : R"({"ready":false})"));
    }
    if (path_ == "/v2" || path_ == "/v2/") {
      if (!get) return MethodNotAllowed();
      const json meta = {{"name", kServerName},
                         {"version", kServerVersion},
                         {"extensions",
                          json::array({"binary_tensor_data", "classification",
                                       "statistics", "model_repository"})}};
      return Send(MakeResponse(v, 200, meta.dump()));
    }
    if (path_ == "/metrics") {
      if (!get) return MethodNotAllowed();
      return Send(MakeResponse(v, 200, server_->registry->Render(),
                               "text/plain; version=0.0.4"));
    }
    if (path_ == "/v2/models/stats") {
      if (!get) return MethodNotAllowed();
      return SendJsonOr(repo.Statistics("", ""));
    }
    if (path_ == "/v2/repository/index") {
      if (!post) return MethodNotAllowed();
      auto body = ParseJsonBody(req.body(), "repository index");
      if (!body.ok()) return Send(ErrorResponse(v, body.status()));
      const bool ready_only = body->value("ready", false);
      return Send(MakeResponse(v, 200, repo.Index(ready_only).dump()));
    }
    if (parts.size() == 5 && parts[0] == "v2" && parts[1] == "repository" &&
        parts[2] == "models" && !parts[3].empty() &&
        (parts[4] == "load" || parts[4] == "unload" || parts[4] == "promote")) {
      if (!post) return MethodNotAllowed();
      return Control(parts[3], parts[4]);
    }
    ModelRoute route;
    if (ParseModelRoute(parts, &route)) {
      if (route.action == "infer") {
        if (!post) return MethodNotAllowed();
        return Infer(route);
      }
      if (!get) return MethodNotAllowed();
      if (route.action == "stats") {
        return SendJsonOr(repo.Statistics(route.name, route.version));
      }
      auto model = repo.Find(route.name, route.version);
      if (!model.ok()) return Send(ErrorResponse(v, model.status()));
      if (route.action == "ready") {
        const bool ready = (*model)->ready();
        const json body = {{"name", (*model)->name()}, {"ready", ready}};
        return Send(MakeResponse(v, ready ? 200 : 503, body.dump()));
      }
      if (route.action == "config") {
        return Send(MakeResponse(v, 200, (*model)->Config().dump()));
      }
      return Send(MakeResponse(v, 200, (*model)->Metadata().dump()));
    }
    Send(ErrorResponse(v, 404, "no endpoint " + method_ + " " + path_));
  }

  void MethodNotAllowed() {
    Send(ErrorResponse(request_.version(), 405,
                       "method " + method_ + " not allowed on " + path_));
  }

  void SendJsonOr(const StatusOr<json>& result) {
    if (!result.ok()) {
      return Send(ErrorResponse(request_.version(), result.status()));
    }
    Send(MakeResponse(request_.version(), 200, result->dump()));
  }

  // Load/unload run on the control thread; the answer comes back here.
  void Control(const std::string& name, const std::string& action) {
    const unsigned version = request_.version();
    auto body = ParseJsonBody(request_.body(), action.c_str());
    if (!body.ok()) return Send(ErrorResponse(version, body.status()));
    json parameters = body->contains("parameters") ? (*body)["parameters"]
                                                   : json();
    net::post(server_->control, [self = shared_from_this(), name, action,
                                 parameters = std::move(parameters), version] {
      ModelRepository& repo = *self->server_->repository;
      const Status status = action == "load"     ? repo.Load(name, parameters)
                            : action == "unload" ? repo.Unload(name, parameters)
                                                 : repo.Promote(name);
      Response res = status.ok() ? MakeResponse(version, 200, "{}")
                                 : ErrorResponse(version, status);
      net::post(self->stream_.get_executor(),
                [self, res = std::move(res)]() mutable {
                  self->Send(std::move(res));
                });
    });
  }

  // ---- inference ------------------------------------------------------------
  void Infer(const ModelRoute& route) {
    const unsigned version = request_.version();
    auto routed = server_->repository->Route(route.name, route.version);
    if (!routed.ok()) return Send(ErrorResponse(version, routed.status()));
    std::shared_ptr<Model> model = routed->answer;
    model_metrics_ = model->metrics();
    if (!model->ready()) {
      return Send(ErrorResponse(
          version, Unavailable("model '" + model->name() + "' is not ready")));
    }
    std::optional<size_t> json_length;
    const auto header = request_.find(kHeaderLength);
    if (header != request_.end()) {
      auto parsed = ParseInferenceHeaderLength(std::string(header->value()),
                                               request_.body().size());
      if (!parsed.ok()) return Send(ErrorResponse(version, parsed.status()));
      json_length = *parsed;
    }
    auto parsed = ParseInferRequest(request_.body(), json_length, model->io());
    if (!parsed.ok()) return Send(ErrorResponse(version, parsed.status()));
    auto request = std::make_shared<InferRequest>(std::move(parsed).value());
    const auto deadline = RequestDeadline(server_->options.request_timeout_ms,
                                        request->timeout_us);
    if (model_metrics_ != nullptr) model_metrics_->AddInflight(1);
    inflight_ = true;
    const uint64_t token = ++infer_token_;
    // A backstop for a batch that never returns: answer 504 shortly after
    // the deadline (the batcher itself fails expired requests first).
    timer_.emplace(stream_.get_executor());
    timer_->expires_at(deadline + std::chrono::milliseconds(100));
    timer_->async_wait([self = shared_from_this(), token,
                        version](beast::error_code ec) {
      if (ec || token != self->infer_token_ || !self->inflight_) return;
      self->FinishInfer(ErrorResponse(
          version, DeadlineExceeded("inference request timed out "
                                    "(--request-timeout-ms or the request's "
                                    "'timeout' parameter)")));
    });
    auto executor = stream_.get_executor();
    // The id the prediction log files the answer under: the body's "id",
    // else an X-Request-Id header (KServe's logger), else a new UUID.
    LogContext context{request->id.value_or(""), routed->role, true};
    if (context.id.empty()) {
      const auto rid = request_.find("x-request-id");
      if (rid != request_.end()) context.id = std::string(rid->value());
    }
    StartShadow(*routed, request->inputs, deadline, &context);
    model->InferAsync(
        std::move(request->inputs), deadline,
        [self = shared_from_this(), model, request, token, version,
         executor](StatusOr<std::vector<Tensor>> outputs) {
          // On a batcher worker: encode here, write on the connection's loop.
          Response res = ErrorResponse(version, 500, "unset");
          if (!outputs.ok()) {
            res = ErrorResponse(version, outputs.status());
          } else {
            auto encoded =
                EncodeInferResponse(model->name(), model->version(), *request,
                                    *outputs, model->io());
            if (!encoded.ok()) {
              res = ErrorResponse(version, encoded.status());
            } else {
              res = MakeResponse(version, 200, std::move(encoded->body),
                                 encoded->content_type);
              if (encoded->json_length.has_value()) {
                res.set(kHeaderLength, std::to_string(*encoded->json_length));
              }
            }
          }
          net::post(executor, [self, token, res = std::move(res)]() mutable {
            if (token != self->infer_token_ || !self->inflight_) return;
            self->FinishInfer(std::move(res));
          });
        },
        context);
  }

  void FinishInfer(Response res) {
    inflight_ = false;
    if (timer_) timer_->cancel();
    if (model_metrics_ != nullptr) model_metrics_->AddInflight(-1);
    Send(std::move(res));
  }

  // ---- writing --------------------------------------------------------------
  void Send(Response res) {
    ++served_;
    const bool keep = !close_after_ && !*server_->draining &&
                      !server_->stopping && request_.keep_alive() &&
                      served_ < server_->options.keep_alive_max_count;
    res.keep_alive(keep);
    res.prepare_payload();
    response_ = std::make_shared<Response>(std::move(res));
    stream_.expires_after(
        std::chrono::milliseconds(server_->options.body_timeout_ms));
    http::async_write(
        stream_, *response_,
        beast::bind_front_handler(&Session::OnWrite, shared_from_this()));
  }

  void OnWrite(beast::error_code ec, size_t) {
    Record();
    const bool keep = response_->keep_alive();
    response_.reset();
    request_ = {};
    if (!ec && !keep && linger_) return Linger();
    if (ec || !keep) return Close();
    // An idle connection keeps a small buffer, whatever it last read.
    if (buffer_.size() == 0 && buffer_.capacity() > kIdleBuffer) {
      buffer_.shrink_to_fit();
    }
    Read();
  }

  void Record() {
    const int status = response_->result_int();
    const double seconds =
        start_ ? std::chrono::duration<double>(Clock::now() - *start_).count()
               : 0.0;
    ServingMetrics* metrics = server_->metrics();
    const std::string method = method_.empty() ? "-" : method_;
    if (metrics != nullptr) metrics->RecordHttpRequest(method, status);
    const bool infer = request_.method() == http::verb::post &&
                       path_.size() > 6 &&
                       path_.compare(path_.size() - 6, 6, "/infer") == 0;
    if (infer || status == 413) {
      ServingMetrics* m = model_metrics_ != nullptr ? model_metrics_ : metrics;
      if (m != nullptr) m->RecordInferRequest(status, seconds);
    }
    if (server_->options.access_log) {
      LogInfo("access", {{"method", method},
                         {"path", path_},
                         {"status", status},
                         {"ms", std::round(seconds * 1e6) / 1e3},
                         {"remote", remote_},
                         {"bytes_in", request_.body().size()},
                         {"bytes_out", response_->body().size()}});
    }
    start_.reset();
    model_metrics_ = nullptr;
    method_.clear();
    path_.clear();
  }

  // nginx's lingering close: the answer is written, so stop sending (the
  // client reads the FIN after the 413), then read and discard what the
  // client still sends of the refused body, up to --lingering-close-bytes
  // and --lingering-close-ms. Closing with unread bytes would make the
  // kernel reset the connection, and the client's pending send would fail
  // (EPIPE / ECONNRESET) before it reads the 413.
  void Linger() {
    const HttpOptions& options = server_->options;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec || server_->stopping || options.lingering_close_bytes <= 0 ||
        options.lingering_close_ms <= 0) {
      return Close();
    }
    lingering_ = true;
    buffer_.clear();  // what was read past the headers is discarded too
    stream_.expires_after(std::chrono::milliseconds(options.lingering_close_ms));
    DrainSome();
  }

  void DrainSome() {
    const uint64_t left =
        static_cast<uint64_t>(server_->options.lingering_close_bytes) - drained_;
    // Read into the buffer's free space and never commit it: discarded.
    stream_.async_read_some(
        buffer_.prepare(static_cast<size_t>(std::min<uint64_t>(left, kReadChunk))),
        beast::bind_front_handler(&Session::OnDrain, shared_from_this()));
  }

  void OnDrain(beast::error_code ec, size_t n) {
    drained_ += n;
    // eof: the client is done; timeout, a reset or the byte bound: give up
    if (ec || server_->stopping ||
        drained_ >= static_cast<uint64_t>(server_->options.lingering_close_bytes)) {
      return Close();
    }
    DrainSome();
  }

  void Close() {
    lingering_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  Impl* const server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;  // bounded by the parser's header/body limits
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::empty_body>> continue_;
  http::request<http::string_body> request_;
  std::shared_ptr<Response> response_;
  std::optional<net::steady_timer> timer_;
  std::optional<Clock::time_point> start_;
  std::string remote_ = "-";
  std::string method_;
  std::string path_;
  ServingMetrics* model_metrics_ = nullptr;
  uint64_t infer_token_ = 0;
  bool inflight_ = false;
  bool idle_ = false;
  bool close_after_ = false;
  bool linger_ = false;     // close by draining the request first (Linger)
  bool lingering_ = false;  // draining now
  uint64_t drained_ = 0;
  int served_ = 0;
};

void HttpServer::Impl::Accept() {
  // The new connection goes to the next loop in turn.
  auto& loop = *loops[next_loop];
  next_loop = (next_loop + 1) % loops.size();
  acceptor.async_accept(
      loop.get_executor(), beast::bind_front_handler(&Impl::OnAccept, this));
}

void HttpServer::Impl::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (stopping || !acceptor.is_open()) return;
  if (ec) {
    // Out of descriptors or a transient error: keep accepting.
    LogWarn("accept failed", {{"error", ec.message()}});
  } else if (connections.load() >= options.max_connections) {
    Reject(std::move(socket));
  } else {
    connections.fetch_add(1);
    auto session = std::make_shared<Session>(this, std::move(socket));
    {
      std::lock_guard<std::mutex> lock(sessions_mu);
      sessions.insert(session.get());
    }
    session->Start();
  }
  Accept();
}

// Past --max-connections: a short 503 and close, without reading.
void HttpServer::Impl::Reject(tcp::socket socket) {
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  auto res = std::make_shared<Response>(ErrorResponse(
      11, 503,
      "too many open connections (--max-connections=" +
          std::to_string(options.max_connections) + "); retry later"));
  res->keep_alive(false);
  res->prepare_payload();
  stream->expires_after(std::chrono::seconds(1));
  http::async_write(*stream, *res,
                    [stream, res](beast::error_code, size_t) {
                      beast::error_code ignored;
                      stream->socket().shutdown(tcp::socket::shutdown_both,
                                                ignored);
                      stream->close();
                    });
  if (metrics() != nullptr) metrics()->RecordHttpRequest("-", 503);
}

HttpServer::HttpServer() = default;

HttpServer::~HttpServer() {
  if (impl_) impl_->control.join();
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(
    const HttpOptions& options, ModelRepository* repository,
    Registry* registry) {
  if (repository == nullptr || registry == nullptr) {
    return InvalidArgument("HTTP server needs a model repository and metrics");
  }
  if (options.threads < 1) return InvalidArgument("--http-threads must be >= 1");
  if (options.max_connections < 1) {
    return InvalidArgument("--max-connections must be >= 1");
  }
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>(options, repository, registry,
                                         &server->draining_);
  return server;
}

Status HttpServer::Bind() {
  Impl& impl = *impl_;
  beast::error_code ec;
  const auto address = net::ip::make_address(impl.options.host, ec);
  if (ec) return InvalidArgument("bad --host '" + impl.options.host + "'");
  const tcp::endpoint endpoint(address,
                               static_cast<unsigned short>(impl.options.port));
  impl.acceptor.open(endpoint.protocol(), ec);
  // SO_REUSEADDR only (no SO_REUSEPORT: a second server must fail to bind).
  if (!ec) impl.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot bind " + impl.options.host + ":" +
                       std::to_string(impl.options.port) + " (" +
                       ec.message() + ")");
  }
  port_ = impl.acceptor.local_endpoint().port();
  return Status::Ok();
}

void HttpServer::Run() {
  Impl& impl = *impl_;
  if (impl.stopping) return;
  net::dispatch(impl.acceptor.get_executor(), [&impl] { impl.Accept(); });
  std::vector<std::thread> threads;
  for (size_t i = 1; i < impl.loops.size(); ++i) {
    threads.emplace_back([&impl, i] { impl.loops[i]->run(); });
  }
  impl.loops[0]->run();
  for (auto& t : threads) t.join();
}

void HttpServer::Stop() {
  Impl& impl = *impl_;
  if (impl.stopping.exchange(true)) return;
  net::dispatch(impl.acceptor.get_executor(), [&impl] {
    beast::error_code ec;
    impl.acceptor.close(ec);
  });
  // Each loop returns from run() once its connections are gone.
  for (auto& guard : impl.keep_running) guard.reset();
  std::vector<std::shared_ptr<Impl::Session>> open;
  {
    std::lock_guard<std::mutex> lock(impl.sessions_mu);
    // A session being destroyed is still listed until its destructor takes
    // the lock, but can no longer be locked.
    for (Impl::Session* session : impl.sessions) {
      if (auto alive = session->weak_from_this().lock()) {
        open.push_back(std::move(alive));
      }
    }
  }
  for (auto& session : open) session->CloseIfIdle();
}

int HttpServer::connections() const {
  return impl_->connections.load();
}

}  // namespace serving

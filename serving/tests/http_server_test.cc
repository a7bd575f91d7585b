// End-to-end tests of the REST endpoints over loopback, with a fake backend.
#include "http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "fake_backend.h"
#include "logging.h"
#include "metrics.h"
#include "model.h"
#include "repository.h"

namespace serving {
namespace {

using json = nlohmann::json;
using testing::FakeBackend;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogLevel(LogLevel::kWarn);
    char tmpl[] = "/tmp/serving_http_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/signature.json") << R"({
      "task": "toy",
      "inputs": [{"name": "x", "shape": [-1, 2], "dtype": "float32"}],
      "outputs": [{"name": "y", "shape": [-1, 2], "dtype": "float32"}],
      "label_names": ["a", "b"],
      "formats": {"legacy": {"program": "model.pdmodel", "params": "model.pdiparams"}}
    })";
    std::ofstream(dir_ + "/model.pdmodel") << "fake";
  }

  void TearDown() override {
    StopServer();
    std::remove((dir_ + "/signature.json").c_str());
    std::remove((dir_ + "/model.pdmodel").c_str());
    std::remove((dir_ + "/" + kModelConfigFile).c_str());
    rmdir(dir_.c_str());
  }

  BackendFactory Factory() {
    return [this](const BackendOptions&) -> StatusOr<std::unique_ptr<Backend>> {
      if (fail_backend_) return Internal("fake backend cannot load");
      auto backend = std::make_unique<FakeBackend>(1, 2);
      backend->set_latency(backend_latency_);
      backend_ = backend.get();
      return StatusOr<std::unique_ptr<Backend>>(std::move(backend));
    };
  }

  void StartServer(bool load = true) {
    ServerConfig config;
    config.model_dir = dir_;
    config.max_batch_size = 4;
    config.max_queue_delay_us = 1000;
    config.request_timeout_ms = timeout_ms_;
    config.model_control = model_control_;
    repo_ = std::make_unique<ModelRepository>(config, Factory(), &registry_);
    ASSERT_TRUE(repo_->Prepare().ok());
    options_.host = "127.0.0.1";
    options_.port = 0;
    options_.max_body_bytes = 4096;
    options_.request_timeout_ms = timeout_ms_;
    options_.access_log = false;
    auto server = HttpServer::Create(options_, repo_.get(), &registry_);
    ASSERT_TRUE(server.ok());
    server_ = std::move(server).value();
    ASSERT_TRUE(server_->Bind().ok());
    thread_ = std::thread([this] { server_->Run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
    if (load) {
      ASSERT_TRUE(repo_->LoadPrepared().ok());
    }
  }

  void StopServer() {
    if (server_) {
      server_->Stop();
      if (thread_.joinable()) thread_.join();
      server_.reset();
    }
    if (repo_) repo_->StopAll();
  }

  httplib::Result Infer(
      const std::string& body,
      const std::string& path = "/v2/models/toy-classifier/infer",
      httplib::Headers headers = {}) {
    return client_->Post(path, headers, body, "application/json");
  }

  static std::string JsonInfer(const std::string& extra = "") {
    return R"({"id":"q","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3,4]}])" +
           extra + "}";
  }

  std::string dir_;
  int64_t timeout_ms_ = 5000;
  std::chrono::milliseconds backend_latency_{0};
  FakeBackend* backend_ = nullptr;
  std::atomic<bool> fail_backend_{false};  // the factory fails (a bad bundle)
  bool model_control_ = false;
  HttpOptions options_;
  Registry registry_;
  std::unique_ptr<ModelRepository> repo_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, HealthFollowsLoadingAndDraining) {
  StartServer(/*load=*/false);
  EXPECT_EQ(client_->Get("/v2/health/live")->status, 200);
  EXPECT_EQ(client_->Get("/v2/health/ready")->status, 503);
  EXPECT_EQ(client_->Get("/v2/models/toy-classifier/ready")->status, 503);
  EXPECT_EQ(Infer(JsonInfer())->status, 503);
  ASSERT_TRUE(repo_->LoadPrepared().ok());
  EXPECT_EQ(client_->Get("/v2/health/ready")->status, 200);
  EXPECT_EQ(client_->Get("/v2/models/toy-classifier/ready")->status, 200);
  EXPECT_EQ(client_->Get("/v2/models/toy-classifier/versions/1/ready")->status,
            200);
  server_->SetDraining();
  EXPECT_EQ(client_->Get("/v2/health/ready")->status, 503);
  EXPECT_EQ(client_->Get("/v2/health/live")->status, 200);
  EXPECT_EQ(Infer(JsonInfer())->status, 200);  // still served while draining
}

TEST_F(HttpServerTest, ServerAndModelMetadata) {
  StartServer();
  auto res = client_->Get("/v2");
  ASSERT_EQ(res->status, 200);
  const json server = json::parse(res->body);
  EXPECT_EQ(server["name"], kServerName);
  EXPECT_NE(std::find(server["extensions"].begin(), server["extensions"].end(),
                      "binary_tensor_data"),
            server["extensions"].end());

  for (const char* path :
       {"/v2/models/toy-classifier", "/v2/models/toy-classifier/versions/1"}) {
    res = client_->Get(path);
    ASSERT_EQ(res->status, 200) << path;
    const json meta = json::parse(res->body);
    EXPECT_EQ(meta["name"], "toy-classifier");
    EXPECT_EQ(meta["versions"], json::array({"1"}));
    EXPECT_EQ(meta["platform"], "openvino_paddle");
    EXPECT_EQ(meta["inputs"][0],
              json({{"name", "x"}, {"datatype", "FP32"}, {"shape", {-1, 2}}}));
    EXPECT_EQ(meta["outputs"][0]["name"], "y");
  }
  res = client_->Get("/v2/models/other");
  EXPECT_EQ(res->status, 404);
  EXPECT_NE(json::parse(res->body)["error"].get<std::string>().find(
                "unknown model 'other'"),
            std::string::npos);
  res = client_->Get("/v2/models/toy-classifier/versions/2");
  EXPECT_EQ(res->status, 404);
  EXPECT_NE(res->body.find("unknown version '2'"), std::string::npos);
  res = client_->Get("/no/such/path");
  EXPECT_EQ(res->status, 404);
  EXPECT_TRUE(json::parse(res->body).contains("error"));
}

TEST_F(HttpServerTest, InferJson) {
  StartServer();
  auto res = Infer(JsonInfer());
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_FALSE(res->has_header("Inference-Header-Content-Length"));
  const json body = json::parse(res->body);
  EXPECT_EQ(body["id"], "q");
  EXPECT_EQ(body["model_name"], "toy-classifier");
  EXPECT_EQ(body["outputs"][0]["shape"], json({2, 2}));
  EXPECT_EQ(body["outputs"][0]["data"], json({2, 4, 6, 8}));

  res = Infer(JsonInfer(), "/v2/models/toy-classifier/versions/1/infer");
  EXPECT_EQ(res->status, 200);

  res = Infer(JsonInfer(
      R"(,"outputs":[{"name":"y","parameters":{"classification":1}}])"));
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["outputs"][0]["data"],
            json({"4:1:b", "8:1:b"}));
}

TEST_F(HttpServerTest, InferBinary) {
  StartServer();
  const std::string header =
      R"({"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}],)"
      R"("outputs":[{"name":"y","parameters":{"binary_data":true}}]})";
  const float in[] = {1.5f, -2.0f};
  std::string body = header;
  body.append(reinterpret_cast<const char*>(in), sizeof(in));
  auto res = client_->Post(
      "/v2/models/toy-classifier/infer",
      {{"Inference-Header-Content-Length", std::to_string(header.size())}},
      body, "application/octet-stream");
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/octet-stream");
  const size_t n =
      std::stoul(res->get_header_value("Inference-Header-Content-Length"));
  const json meta = json::parse(res->body.substr(0, n));
  EXPECT_EQ(meta["outputs"][0]["parameters"]["binary_data_size"], 8);
  ASSERT_EQ(res->body.size(), n + 8);
  float out[2];
  std::memcpy(out, res->body.data() + n, sizeof(out));
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], -4.0f);

  // Truncated binary payload and a header length past the body: 400.
  res = client_->Post(
      "/v2/models/toy-classifier/infer",
      {{"Inference-Header-Content-Length", std::to_string(header.size())}},
      body.substr(0, body.size() - 3), "application/octet-stream");
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("truncated"), std::string::npos);
  res = client_->Post("/v2/models/toy-classifier/infer",
                      {{"Inference-Header-Content-Length", "100000"}}, body,
                      "application/octet-stream");
  EXPECT_EQ(res->status, 400);
}

TEST_F(HttpServerTest, ErrorsAreJsonWithTheRightStatus) {
  StartServer();
  auto expect =
      [this](const std::string& body, int status, const std::string& fragment,
             const std::string& path = "/v2/models/toy-classifier/infer") {
        auto res = Infer(body, path);
        ASSERT_TRUE(res) << "no response";
        EXPECT_EQ(res->status, status) << res->body;
        const json error = json::parse(res->body);
        EXPECT_NE(error["error"].get<std::string>().find(fragment),
                  std::string::npos)
            << res->body;
      };
  expect("{oops", 400, "malformed JSON");
  expect(
      R"({"inputs":[{"name":"x","shape":[1,2],"datatype":"INT64","data":[1,2]}]})",
      400, "datatype INT64 is not supported");
  expect(
      R"({"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]})",
      400, "does not match the model's [-1,2]");
  expect(
      R"({"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1]}]})",
      400, "'data' has 1 elements");
  expect(
      R"({"inputs":[{"name":"x","shape":[5,2],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10]}]})",
      400, "exceeds the max batch size 4");
  expect(JsonInfer(), 404, "unknown model 'nope'", "/v2/models/nope/infer");
  expect(JsonInfer(), 404, "unknown version '3'",
         "/v2/models/toy-classifier/versions/3/infer");
  expect(std::string(5000, ' '), 413, "exceeds the limit of 4096 bytes");
}

TEST_F(HttpServerTest, TimeoutGives504AndTheServerKeepsWorking) {
  timeout_ms_ = 100;
  backend_latency_ = std::chrono::milliseconds(400);
  StartServer();
  auto res = Infer(JsonInfer());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 504);
  EXPECT_NE(res->body.find("timed out"), std::string::npos);
  backend_->set_latency(std::chrono::milliseconds(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // The request's own, shorter "timeout" parameter (microseconds) also works.
  res = Infer(JsonInfer(R"(,"parameters":{"timeout":50000})"));
  EXPECT_EQ(res->status, 200);
}

TEST_F(HttpServerTest, MetricsCountRequests) {
  StartServer();
  ASSERT_EQ(Infer(JsonInfer())->status, 200);
  ASSERT_EQ(Infer("{bad")->status, 400);
  ASSERT_EQ(Infer(std::string(5000, ' '))->status, 413);
  const std::string labels = "model=\"toy-classifier\",version=\"1\"";
  const std::vector<std::string> expected = {
      "kserve_requests_total{" + labels + ",code=\"200\"} 1",
      "kserve_requests_total{" + labels + ",code=\"400\"} 1",
      "kserve_request_failures_total{" + labels +
          ",reason=\"payload_too_large\"} 1",
      "kserve_batch_size_count{" + labels + "} 1",
      "kserve_http_requests_total{method=\"POST\",code=\"413\"} 1",
  };
  // Requests are counted by the access logger, which runs just after the
  // response is sent: poll briefly.
  std::string text;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto res = client_->Get("/metrics");
    ASSERT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"),
              "text/plain; version=0.0.4");
    text = res->body;
    bool all = true;
    for (const auto& line : expected) {
      all = all && text.find(line) != std::string::npos;
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& line : expected) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

TEST_F(HttpServerTest, ConcurrentClientsGetTheirOwnResults) {
  StartServer();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      httplib::Client cli("127.0.0.1", server_->port());
      for (int i = 0; i < 25; ++i) {
        const float v = t * 1000 + i;
        const std::string body =
            R"({"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[)" +
            std::to_string(v) + "," + std::to_string(v + 0.5f) + "]}]}";
        auto res = cli.Post("/v2/models/toy-classifier/infer", body,
                            "application/json");
        if (!res || res->status != 200) {
          ++bad;
          continue;
        }
        const json out = json::parse(res->body)["outputs"][0]["data"];
        if (out[0].get<float>() != 2 * v ||
            out[1].get<float>() != 2 * (v + 0.5f)) {
          ++bad;
        }
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(HttpServerTest, DrainingResponsesCloseTheConnection) {
  StartServer();
  client_->set_keep_alive(true);
  EXPECT_FALSE(client_->Get("/v2/health/live")->has_header("Connection"));
  server_->SetDraining();
  auto res = client_->Get("/v2/health/live");
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Connection"), "close");
}

// Raw HTTP over a socket: the status line of the server's first answer.
// A loopback connection to `port` that sent `bytes` (-1 if refused).
int OpenPartial(int port, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  if (!bytes.empty()) send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  return fd;
}

std::string RawStatusLine(int port, const std::string& request) {
  const int fd = OpenPartial(port, request);
  if (fd < 0) return "connect failed";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[4096];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  close(fd);
  if (n <= 0) return "no answer";
  const std::string text(buf, static_cast<size_t>(n));
  return text.substr(0, text.find("\r\n"));
}

TEST_F(HttpServerTest, OversizeBodyIsRefusedBeforeUploadWith100Continue) {
  StartServer();
  const std::string headers =
      "POST /v2/models/toy-classifier/infer HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\nExpect: 100-continue\r\n";
  EXPECT_EQ(RawStatusLine(server_->port(),
                          headers + "Content-Length: 100000\r\n\r\n"),
            "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(
      RawStatusLine(server_->port(), headers + "Content-Length: 10\r\n\r\n"),
      "HTTP/1.1 100 Continue");
}

// Sends `request` and then `body_bytes` bytes of body, blocking as an HTTP
// client's upload does, then reads the answer until the server's EOF. The
// answer's head, or what failed ("send failed: ...").
std::string UploadThenRead(int port, const std::string& request,
                           size_t body_bytes) {
  const int fd = OpenPartial(port, request);
  if (fd < 0) return "connect failed";
  timeval tv{10, 0};  // a server that neither reads nor closes: fail, not hang
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const std::string chunk(64 * 1024, '\0');
  for (size_t sent = 0; sent < body_bytes;) {
    const ssize_t n = send(fd, chunk.data(),
                           std::min(chunk.size(), body_bytes - sent), MSG_NOSIGNAL);
    if (n < 0) {
      const int err = errno;
      close(fd);
      return std::string("send failed: ") + std::strerror(err);
    }
    sent += static_cast<size_t>(n);
  }
  std::string text;
  char buf[4096];
  ssize_t n = 0;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
    text.append(buf, static_cast<size_t>(n));
  }
  const int err = errno;
  close(fd);
  if (n < 0) return std::string("recv failed: ") + std::strerror(err);
  return text.substr(0, text.find("\r\n\r\n"));
}

std::string OversizeRequest(size_t body_bytes) {
  return "POST /v2/models/toy-classifier/infer HTTP/1.1\r\nHost: x\r\n"
         "Content-Type: application/octet-stream\r\nContent-Length: " +
         std::to_string(body_bytes) + "\r\n\r\n";
}

TEST_F(HttpServerTest, OversizeBodyIsDrainedSoTheClientReadsThe413) {
  StartServer();  // --max-body-bytes 4096
  // far more than the socket buffers hold: closing at once would reset the
  // upload before the client reads the answer
  const size_t body = 32u << 20;
  const std::string head =
      UploadThenRead(server_->port(), OversizeRequest(body), body);
  EXPECT_EQ(head.substr(0, head.find("\r\n")), "HTTP/1.1 413 Payload Too Large")
      << head;
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  EXPECT_EQ(Infer(JsonInfer())->status, 200);
}

TEST_F(HttpServerTest, DrainingARefusedBodyStopsAtItsByteBound) {
  options_.lingering_close_bytes = 64 * 1024;
  StartServer();
  const size_t body = 96u << 20;  // beyond any socket buffers (tcp_rmem max 32 MiB)
  const std::string head =
      UploadThenRead(server_->port(), OversizeRequest(body), body);
  EXPECT_EQ(head.rfind("send failed", 0), 0u) << head;
  EXPECT_EQ(Infer(JsonInfer())->status, 200);
}

TEST_F(HttpServerTest, DrainingARefusedBodyStopsAtItsTimeBound) {
  options_.lingering_close_ms = 50;
  StartServer();
  // the client announces 1 MiB, sends 1 KiB and stalls: the server answers,
  // drains what comes for 50 ms and closes (the default: 30 s)
  const int fd = OpenPartial(server_->port(),
                             OversizeRequest(1u << 20) + std::string(1024, 'x'));
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 2000 && server_->connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->connections(), 0);
  char buf[4096];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 413", 0), 0u);
  close(fd);
}

// True when the server closed `fd` (recv sees EOF or a reset) within `wait`.
bool ClosedByServer(int fd, std::chrono::milliseconds wait) {
  timeval tv{static_cast<time_t>(wait.count() / 1000),
             static_cast<suseconds_t>((wait.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[512];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
    // a response (e.g. 408/400) before the close is fine: keep reading
  }
}

TEST_F(HttpServerTest, SlowAndIdleClientsDoNotDelayOthers) {
  options_.threads = 1;  // one event loop for everything
  StartServer();
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = OpenPartial(
        server_->port(),
        i % 2 == 0 ? "" : "POST /v2/models/toy-classifier/infer HTTP/1.1\r\nHo");
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  for (int i = 0; i < 20; ++i) {
    const auto start = Clock::now();
    auto res = Infer(JsonInfer());
    ASSERT_TRUE(res) << "request " << i;
    EXPECT_EQ(res->status, 200);
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  }
  EXPECT_GE(server_->connections(), 300);
  for (int fd : slow) close(fd);
}

TEST_F(HttpServerTest, HeadersTricklingPastTheTimeoutAreCutOff) {
  options_.header_timeout_ms = 300;
  StartServer();
  const int fd = OpenPartial(server_->port(), "GET /v2/health/live HTTP/1.1\r\n");
  ASSERT_GE(fd, 0);
  const auto start = Clock::now();
  // One header byte every 50 ms would keep an inactivity timer alive forever.
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {
    closed = send(fd, "X", 1, MSG_NOSIGNAL) < 0;
    if (!closed) closed = ClosedByServer(fd, std::chrono::milliseconds(50));
  }
  const auto took = Clock::now() - start;
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  EXPECT_EQ(client_->Get("/v2/health/live")->status, 200);
}

TEST_F(HttpServerTest, ConnectionsPastTheLimitGet503) {
  options_.max_connections = 4;
  StartServer();
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(OpenPartial(server_->port(), ""));
  // Accepting is asynchronous: wait until the server counts all four.
  for (int i = 0; i < 200 && server_->connections() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(server_->connections(), 4);
  EXPECT_EQ(RawStatusLine(server_->port(), "GET /v2/health/live HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 503 Service Unavailable");
  for (int fd : idle) close(fd);
  for (int i = 0; i < 200 && server_->connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(client_->Get("/v2/health/live")->status, 200);
}

TEST_F(HttpServerTest, MalformedAndOversizedHeadersAreRefused) {
  StartServer();
  EXPECT_EQ(RawStatusLine(server_->port(), "NOT HTTP AT ALL\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(RawStatusLine(server_->port(), "GET /v2 HTTP/1.1\r\nX-Big: " +
                                               std::string(20000, 'a') +
                                               "\r\n\r\n"),
            "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(client_->Post("/v2/health/live", "", "text/plain")->status, 405);
  EXPECT_EQ(client_->Get("/v2/models/toy-classifier/versions/1/ready")->status,
            200);
}

TEST_F(HttpServerTest, StatisticsCountRequestsAndBatches) {
  StartServer();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Infer(JsonInfer())->status, 200);
  auto res = client_->Get("/v2/models/toy-classifier/stats");
  ASSERT_EQ(res->status, 200);
  const json body = json::parse(res->body);
  ASSERT_EQ(body["model_stats"].size(), 1u);
  const json& stats = body["model_stats"][0];
  EXPECT_EQ(stats["name"], "toy-classifier");
  EXPECT_EQ(stats["version"], "1");
  EXPECT_EQ(stats["inference_stats"]["success"]["count"], 3);
  EXPECT_EQ(stats["inference_stats"]["queue"]["count"], 3);
  EXPECT_EQ(stats["inference_count"], 6);  // 3 requests of batch 2
  EXPECT_GT(stats["inference_stats"]["compute_infer"]["ns"].get<uint64_t>(), 0u);
  EXPECT_GE(stats["last_inference"].get<uint64_t>(), 1u);
  EXPECT_EQ(client_->Get("/v2/models/stats")->status, 200);
  EXPECT_EQ(client_->Get("/v2/models/other/stats")->status, 404);
  EXPECT_EQ(client_->Get("/v2/models/toy-classifier/versions/9/stats")->status,
            404);
}

TEST_F(HttpServerTest, LoadAndUnloadNeedModelControl) {
  StartServer();
  auto res = client_->Post("/v2/repository/models/toy-classifier/load", "",
                           "application/json");
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("--model-control"), std::string::npos) << res->body;
  res = client_->Post("/v2/repository/index", "", "application/json");
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body),
            json::parse(R"([{"name":"toy-classifier","version":"1",)"
                        R"("state":"READY","reason":""}])"));
}

TEST_F(HttpServerTest, LoadSwapsTheVersionAndTheOldOneDrains) {
  model_control_ = true;
  StartServer();
  auto res = client_->Post(
      "/v2/repository/models/toy-classifier/load",
      R"({"parameters":{"config":"{\"version\":\"2\"}"}})", "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  res = Infer(JsonInfer());
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["model_version"], "2");
  EXPECT_EQ(Infer(JsonInfer(), "/v2/models/toy-classifier/versions/1/infer")
                ->status,
            404);
  res = client_->Post("/v2/repository/index", R"({"ready":true})",
                      "application/json");
  EXPECT_EQ(json::parse(res->body).size(), 1u);
  res = client_->Post("/v2/repository/models/toy-classifier/load",
                      R"({"parameters":{"colour":"red"}})", "application/json");
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("colour"), std::string::npos);
  res = client_->Post("/v2/repository/models/toy-classifier/unload",
                      R"({"parameters":{"unload_dependents":false}})",
                      "application/json");
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(client_->Get("/v2/health/ready")->status, 503);
  EXPECT_EQ(Infer(JsonInfer())->status, 503);
}

TEST_F(HttpServerTest, AFailedLoadLeavesNoIndexEntryBehind) {
  model_control_ = true;
  StartServer();
  fail_backend_ = true;  // a bundle the backend cannot read
  for (const char* load : {R"({"parameters":{"version":"2"}})",
                           R"({"parameters":{}})"}) {  // the served version
    auto res = client_->Post("/v2/repository/models/toy-classifier/load", load,
                             "application/json");
    ASSERT_EQ(res->status, 500) << load;
    EXPECT_NE(res->body.find("fake backend cannot load"), std::string::npos);
  }
  // version 1 serves on; the index and statistics say only that
  const json served = json::parse(
      R"([{"name":"toy-classifier","version":"1","state":"READY","reason":""}])");
  auto res = client_->Post("/v2/repository/index", "", "application/json");
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body), served);
  const json stats =
      json::parse(client_->Get("/v2/models/toy-classifier/stats")->body);
  ASSERT_EQ(stats["model_stats"].size(), 1u) << stats;
  EXPECT_EQ(stats["model_stats"][0]["version"], "1");
  res = Infer(JsonInfer());
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["model_version"], "1");
  // a good load afterwards: the usual history (the old version drains)
  fail_backend_ = false;
  res = client_->Post("/v2/repository/models/toy-classifier/load",
                      R"({"parameters":{"version":"2"}})", "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  const json index = json::parse(
      client_->Post("/v2/repository/index", "", "application/json")->body);
  ASSERT_EQ(index.size(), 2u) << index;
  EXPECT_EQ(index[0]["version"], "2");
  EXPECT_EQ(index[0]["state"], "READY");
  EXPECT_EQ(index[1]["version"], "1");
  EXPECT_EQ(index[1]["reason"], "replaced by version 2");
}

TEST_F(HttpServerTest, EachVersionRunsWithItsOwnModelConfig) {
  std::ofstream(dir_ + "/" + kModelConfigFile)
      << R"({"max_batch_size": 3, "max_queue_size": 7, "workers": 2})";
  model_control_ = true;
  StartServer();
  auto res = client_->Get("/v2/models/toy-classifier/config");
  ASSERT_EQ(res->status, 200) << res->body;
  json config = json::parse(res->body);
  EXPECT_EQ(config["version"], "1");
  EXPECT_EQ(config["settings"]["max_batch_size"], 3);  // the file's, not 4
  EXPECT_EQ(config["settings"]["max_queue_size"], 7);
  EXPECT_EQ(config["settings"]["workers"], 2);
  EXPECT_EQ(config["model_config_file"], dir_ + "/" + kModelConfigFile);
  // a request above the file's batch limit is refused
  const std::string four =
      R"({"inputs":[{"name":"x","shape":[4,2],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]}]})";
  EXPECT_EQ(Infer(four)->status, 400);

  // version 2 from a directory without a model_config.json: the operator's
  // settings, not version 1's file
  char tmpl[] = "/tmp/serving_http_test_v2_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir2 = tmpl;
  std::filesystem::copy_file(dir_ + "/signature.json", dir2 + "/signature.json");
  std::filesystem::copy_file(dir_ + "/model.pdmodel", dir2 + "/model.pdmodel");
  const json load = {
      {"parameters",
       {{"config", json({{"version", "2"}, {"model_dir", dir2}}).dump()}}}};
  res = client_->Post("/v2/repository/models/toy-classifier/load", load.dump(),
                      "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  config = json::parse(client_->Get("/v2/models/toy-classifier/config")->body);
  EXPECT_EQ(config["version"], "2");
  EXPECT_EQ(config["settings"]["max_batch_size"], 4);
  EXPECT_EQ(config["settings"]["max_queue_size"], kDefaultMaxQueueSize);
  EXPECT_EQ(config["settings"]["workers"], kDefaultWorkers);
  EXPECT_TRUE(config["model_config_file"].is_null());
  EXPECT_EQ(Infer(four)->status, 200);
  std::filesystem::remove_all(dir2);
}

std::string Gzip(const std::string& text) {
  z_stream zs{};
  deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 9,
               Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, text.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  zs.avail_in = static_cast<uInt>(text.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST_F(HttpServerTest, CompressedBodiesAreInflatedWithinTheBodyLimit) {
  StartServer();
  httplib::Headers gzip = {{"Content-Encoding", "gzip"}};
  auto res = Infer(Gzip(JsonInfer()), "/v2/models/toy-classifier/infer", gzip);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["outputs"][0]["data"],
            json::parse("[2,4,6,8]"));
  // 100 kB of spaces compress to ~100 bytes: still over the 4 kB limit.
  res = Infer(Gzip(std::string(100000, ' ')), "/v2/models/toy-classifier/infer",
              gzip);
  EXPECT_EQ(res->status, 413);
  EXPECT_NE(res->body.find("decompressed"), std::string::npos);
  res = Infer("not gzip at all", "/v2/models/toy-classifier/infer", gzip);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("not valid gzip"), std::string::npos);
  res = Infer(JsonInfer(), "/v2/models/toy-classifier/infer",
              {{"Content-Encoding", "br"}});
  EXPECT_EQ(res->status, 415);
  EXPECT_EQ(Infer(JsonInfer())->status, 200);
}

TEST(HttpServerLifecycleTest, StopBeforeOrWhileRunStartsDoesNotHang) {
  SetLogLevel(LogLevel::kWarn);
  char tmpl[] = "/tmp/serving_http_life_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/signature.json") << R"({
    "inputs": [{"name": "x", "shape": [-1, 2]}],
    "outputs": [{"name": "y", "shape": [-1, 2]}],
    "formats": {"legacy": {"program": "m.pdmodel"}}})";
  std::ofstream(dir + "/m.pdmodel") << "fake";
  ServerConfig config;
  config.model_dir = dir;
  Registry registry;
  ModelRepository repo(config, [](const BackendOptions&) {
    return StatusOr<std::unique_ptr<Backend>>(std::make_unique<FakeBackend>());
  }, &registry);
  ASSERT_TRUE(repo.Prepare().ok());
  HttpOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  for (int stop_first = 0; stop_first < 2; ++stop_first) {
    for (int i = 0; i < 20; ++i) {
      auto server = HttpServer::Create(options, &repo, &registry);
      ASSERT_TRUE(server.ok());
      ASSERT_TRUE((*server)->Bind().ok());
      if (stop_first) (*server)->Stop();
      std::thread run([&] { (*server)->Run(); });
      if (!stop_first) (*server)->Stop();
      run.join();  // would hang if the stop were lost
    }
  }
  std::remove((dir + "/signature.json").c_str());
  std::remove((dir + "/m.pdmodel").c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace serving

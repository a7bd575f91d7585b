// End-to-end tests of the REST endpoints over loopback, with a fake backend.
#include "http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "fake_backend.h"
#include "logging.h"
#include "metrics.h"
#include "model.h"

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
    rmdir(dir_.c_str());
  }

  void StartServer(bool load = true) {
    ServerConfig config;
    config.model_dir = dir_;
    config.max_batch_size = 4;
    config.max_queue_delay_us = 1000;
    config.request_timeout_ms = timeout_ms_;
    auto model = Model::Create(config, [this](const BackendOptions&) {
      auto backend = std::make_unique<FakeBackend>(1, 2);
      backend->set_latency(backend_latency_);
      backend_ = backend.get();
      return StatusOr<std::unique_ptr<Backend>>(std::move(backend));
    });
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
    metrics_ = std::make_unique<ServingMetrics>(&registry_, model_->name(),
                                                model_->version(), 4);
    HttpOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.threads = 4;
    options.max_body_bytes = 4096;
    options.request_timeout_ms = timeout_ms_;
    options.access_log = false;
    auto server =
        HttpServer::Create(options, model_.get(), &registry_, metrics_.get());
    ASSERT_TRUE(server.ok());
    server_ = std::move(server).value();
    ASSERT_TRUE(server_->Bind().ok());
    thread_ = std::thread([this] { server_->Run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
    if (load) {
      ASSERT_TRUE(model_->Load(metrics_.get()).ok());
    }
  }

  void StopServer() {
    if (server_) {
      server_->Stop();
      if (thread_.joinable()) thread_.join();
      server_.reset();
    }
    if (model_) model_->Stop();
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
  Registry registry_;
  std::unique_ptr<ServingMetrics> metrics_;
  std::unique_ptr<Model> model_;
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
  ASSERT_TRUE(model_->Load(metrics_.get()).ok());
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
std::string RawStatusLine(int port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), 0);
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
  auto model = Model::Create(config, [](const BackendOptions&) {
    return StatusOr<std::unique_ptr<Backend>>(std::make_unique<FakeBackend>());
  });
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Registry registry;
  ServingMetrics metrics(&registry, "m", "1", 4);
  HttpOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  for (int stop_first = 0; stop_first < 2; ++stop_first) {
    for (int i = 0; i < 20; ++i) {
      auto server =
          HttpServer::Create(options, model->get(), &registry, &metrics);
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

#include "prediction_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>

#include "logging.h"
#include "metrics.h"

namespace serving {
namespace {

namespace fs = std::filesystem;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;

constexpr const char* kEventType = "org.kubeflow.serving.inference.response";
constexpr const char* kSegmentPrefix = "predictions-";
constexpr const char* kSegmentSuffix = ".jsonl";
constexpr auto kWriterPeriod = std::chrono::milliseconds(50);

// JSON text appended by hand: the writer formats every record, and a
// generic JSON tree (an allocation per node) costs more than the inference
// of a small model.
void AppendEscaped(std::string* out, std::string_view text) {
  out->push_back('"');
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

template <typename T>
void AppendNumber(std::string* out, T value) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, res.ptr);
}

void AppendFloat(std::string* out, float value) {
  if (!std::isfinite(value)) {
    out->append("null");
    return;
  }
  AppendNumber(out, value);
}

template <typename T, typename F>
void AppendArray(std::string* out, const std::vector<T>& values, F each) {
  out->push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out->push_back(',');
    each(out, values[i]);
  }
  out->push_back(']');
}

void AppendKey(std::string* out, const char* key) {
  out->push_back(',');
  out->push_back('"');
  out->append(key);
  out->append("\":");
}

std::string Rfc3339(int64_t time_us) {
  TimeFormat format;
  std::string out;
  format.Append(&out, time_us);
  return out;
}

std::string Source(const PredictionRecord& r) {
  return "paddle-mlops-serving/" + r.model + "/" + r.version;
}

std::string_view Endpoint(const PredictionRecord& r) {
  return r.role.empty() ? std::string_view("default") : std::string_view(r.role);
}

// The event's "data": what the model answered, in JSON.
void AppendData(std::string* out, const PredictionRecord& r) {
  out->append("{\"model_name\":");
  AppendEscaped(out, r.model);
  AppendKey(out, "model_version");
  AppendEscaped(out, r.version);
  AppendKey(out, "role");
  AppendEscaped(out, Endpoint(r));
  AppendKey(out, "answered");
  out->append(r.answered ? "true" : "false");
  AppendKey(out, "latency_us");
  AppendNumber(out, r.latency_us);
  AppendKey(out, "code");
  AppendNumber(out, r.code);
  AppendKey(out, "batch");
  AppendNumber(out, r.batch);
  if (!r.error.empty()) {
    AppendKey(out, "error");
    AppendEscaped(out, r.error);
  }
  if (!r.top1.empty()) {
    AppendKey(out, "top1");
    AppendArray(out, r.top1, [](std::string* o, int64_t v) { AppendNumber(o, v); });
    AppendKey(out, "confidence");
    AppendArray(out, r.confidence, [](std::string* o, float v) { AppendFloat(o, v); });
  }
  if (!r.output_mean.empty()) {
    AppendKey(out, "output_mean");
    AppendArray(out, r.output_mean, [](std::string* o, float v) { AppendFloat(o, v); });
  }
  if (!r.inputs.empty()) {
    AppendKey(out, "inputs");
    AppendArray(out, r.inputs, [](std::string* o, const Tensor& t) {
      o->append("{\"name\":");
      AppendEscaped(o, t.name);
      AppendKey(o, "datatype");
      AppendEscaped(o, DataTypeName(t.dtype));
      AppendKey(o, "shape");
      AppendArray(o, t.shape, [](std::string* o2, int64_t d) { AppendNumber(o2, d); });
      AppendKey(o, "data_base64");
      o->push_back('"');
      o->append(Base64Encode(t.data.data(), t.data.size()));
      o->append("\"}");
    });
  }
  out->push_back('}');
}

// The structured-mode CloudEvent (one JSON Lines record) around `data`.
void AppendEventLine(std::string* out, const PredictionRecord& r,
                     std::string_view data, TimeFormat* time) {
  out->append("{\"specversion\":\"1.0\",\"id\":");
  AppendEscaped(out, r.id);
  AppendKey(out, "type");
  AppendEscaped(out, kEventType);
  AppendKey(out, "source");
  AppendEscaped(out, Source(r));
  AppendKey(out, "time");
  out->push_back('"');
  time->Append(out, r.time_us);
  out->push_back('"');
  out->append(",\"datacontenttype\":\"application/json\"");
  AppendKey(out, "inferenceservicename");
  AppendEscaped(out, r.model);
  AppendKey(out, "modelversion");
  AppendEscaped(out, r.version);
  out->append(",\"component\":\"predictor\"");
  AppendKey(out, "endpoint");
  AppendEscaped(out, Endpoint(r));
  AppendKey(out, "data");
  out->append(data);
  out->append("}\n");
}

// The binary-mode headers KServe's logger sends (ce-* plus content type).
std::string EventHeaders(const PredictionRecord& r) {
  std::string h;
  auto add = [&h](const char* k, std::string_view v) {
    h += k;
    h += '\n';
    h += v;
    h += '\n';
  };
  add("ce-specversion", "1.0");
  add("ce-id", r.id);
  add("ce-type", kEventType);
  add("ce-source", Source(r));
  add("ce-time", Rfc3339(r.time_us));
  add("ce-inferenceservicename", r.model);
  add("ce-modelversion", r.version);
  add("ce-component", "predictor");
  add("ce-endpoint", Endpoint(r));
  return h;
}

struct Url {
  std::string host, port, target;
};

std::optional<Url> ParseHttpUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return std::nullopt;
  std::string rest = url.substr(scheme.size());
  Url out;
  const auto slash = rest.find('/');
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string authority = rest.substr(0, slash);
  const auto colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    out.host = authority.substr(0, colon);
    out.port = authority.substr(colon + 1);
  } else {
    out.host = authority;
    out.port = "80";
  }
  if (out.host.empty() || out.port.empty()) return std::nullopt;
  return out;
}

}  // namespace

void TimeFormat::Append(std::string* out, int64_t time_us) {
  const int64_t sec = time_us / 1000000;
  if (sec != cached_sec_) {
    const std::time_t t = static_cast<std::time_t>(sec);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[40];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    cached_ = buf;
    cached_sec_ = sec;
  }
  char frac[16];
  std::snprintf(frac, sizeof(frac), ".%06lldZ",
                static_cast<long long>(time_us % 1000000));
  out->append(cached_);
  out->append(frac);
}

std::string Base64Encode(const char* data, size_t size) {
  static const char* kChars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  const auto* in = reinterpret_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 2 < size; i += 3) {
    const uint32_t v = (in[i] << 16) | (in[i + 1] << 8) | in[i + 2];
    out += kChars[(v >> 18) & 63];
    out += kChars[(v >> 12) & 63];
    out += kChars[(v >> 6) & 63];
    out += kChars[v & 63];
  }
  if (i < size) {
    uint32_t v = in[i] << 16;
    if (i + 1 < size) v |= in[i + 1] << 8;
    out += kChars[(v >> 18) & 63];
    out += kChars[(v >> 12) & 63];
    out += i + 1 < size ? kChars[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const uint64_t a = rng();
  const uint64_t b = rng();
  unsigned char bytes[16];
  std::memcpy(bytes, &a, 8);
  std::memcpy(bytes + 8, &b, 8);
  bytes[6] = (bytes[6] & 0x0f) | 0x40;  // version 4
  bytes[8] = (bytes[8] & 0x3f) | 0x80;  // variant 10
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15]);
  }
  return out;
}

PredictionLog::PredictionLog(PredictionLogOptions options)
    : options_(std::move(options)),
      wake_at_(std::max<int64_t>(1, options_.queue_size / 4)) {}

StatusOr<std::unique_ptr<PredictionLog>> PredictionLog::Open(
    const PredictionLogOptions& options, Registry* registry) {
  if (options.dir.empty()) return InvalidArgument("prediction log: no directory");
  if (options.segment_bytes < 1024 || options.max_bytes < options.segment_bytes) {
    return InvalidArgument(
        "--prediction-log-max-bytes must be >= --prediction-log-segment-bytes "
        ">= 1024");
  }
  if (!options.sink_url.empty() && !ParseHttpUrl(options.sink_url)) {
    return InvalidArgument("--prediction-log-sink: '" + options.sink_url +
                           "' is not an http://host[:port]/path URL");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) {
    return InvalidArgument("--prediction-log-dir " + options.dir +
                           ": cannot create (" + ec.message() + ")");
  }
  std::unique_ptr<PredictionLog> log(new PredictionLog(options));
  const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  std::string stamp = Rfc3339(now_us);  // 2026-12-04T06:30:00.123456Z
  stamp.erase(std::remove_if(stamp.begin(), stamp.end(),
                             [](char c) { return c == '-' || c == ':'; }),
              stamp.end());
  std::replace(stamp.begin(), stamp.end(), '.', '-');
  // time, host and pid: replicas sharing one volume (every pod is pid 1)
  // never pick the same name
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "host");
  }
  std::string host_part = host;
  for (char& c : host_part) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  log->prefix_ = std::string(kSegmentPrefix) + stamp + "-" + host_part + "-" +
                 std::to_string(::getpid()) + "-";
  RETURN_IF_ERROR(log->OpenSegment());
  if (registry != nullptr) {
    auto& written = registry->AddCounter(
        "serving_prediction_log_written_total",
        "prediction log records appended to the log directory");
    auto& dropped = registry->AddCounter(
        "serving_prediction_log_dropped_total",
        "prediction log records lost: queue_full (the writer fell behind), "
        "write_error, sink_queue_full, sink_error",
        {"reason"});
    auto& sent = registry->AddCounter(
        "serving_prediction_log_sink_sent_total",
        "prediction log events accepted (2xx) by the sink URL");
    auto& rotated = registry->AddCounter(
        "serving_prediction_log_segments_total",
        "prediction log segment files opened");
    log->written_ = &written.counter();
    log->dropped_queue_ = &dropped.counter({"queue_full"});
    log->dropped_write_ = &dropped.counter({"write_error"});
    log->dropped_sink_ = &dropped.counter({"sink_error"});
    log->dropped_sink_queue_ = &dropped.counter({"sink_queue_full"});
    log->sink_sent_ = &sent.counter();
    log->rotated_ = &rotated.counter();
    log->rotated_->Increment();
  }
  log->writer_ = std::thread([raw = log.get()] { raw->WriterLoop(); });
  if (!options.sink_url.empty()) {
    log->sink_ = std::thread([raw = log.get()] { raw->SinkLoop(); });
  }
  LogInfo("prediction log", {{"dir", options.dir},
                             {"max_bytes", options.max_bytes},
                             {"segment_bytes", options.segment_bytes},
                             {"queue_size", options.queue_size},
                             {"sink", options.sink_url}});
  return log;
}

PredictionLog::~PredictionLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  {
    std::lock_guard<std::mutex> lock(sink_mu_);
    sink_stop_ = true;
  }
  sink_cv_.notify_all();
  if (sink_.joinable()) sink_.join();
  if (fd_ >= 0) ::close(fd_);
}

bool PredictionLog::Submit(PredictionRecord record) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ ||
        static_cast<int64_t>(queue_.size()) >= options_.queue_size) {
      if (dropped_queue_ != nullptr) dropped_queue_->Increment();
      return false;
    }
    queue_.push_back(std::move(record));
    ++submitted_;
    if (static_cast<int64_t>(queue_.size()) != wake_at_) return true;
  }
  cv_.notify_one();
  return true;
}

void PredictionLog::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  flush_ = true;
  cv_.notify_one();
  idle_cv_.wait(lock, [&] { return done_ >= target; });
}

Status PredictionLog::OpenSegment() {
  if (fd_ >= 0) ::close(fd_);
  char seq[16];
  std::snprintf(seq, sizeof(seq), "%06lld", static_cast<long long>(segment_seq_++));
  segment_path_ = options_.dir + "/" + prefix_ + seq + kSegmentSuffix;
  fd_ = ::open(segment_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC,
               0644);
  segment_size_ = 0;
  if (fd_ < 0) {
    return Unavailable("prediction log: cannot create " + segment_path_ + ": " +
                       std::strerror(errno));
  }
  if (rotated_ != nullptr) rotated_->Increment();
  return Status::Ok();
}

void PredictionLog::EnforceBound() {
  struct Segment {
    std::string name;
    int64_t size;
  };
  std::vector<Segment> segments;
  int64_t total = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kSegmentPrefix, 0) != 0 || name.size() < 6 ||
        name.compare(name.size() - 6, 6, kSegmentSuffix) != 0) {
      continue;
    }
    std::error_code size_ec;
    const auto size = static_cast<int64_t>(entry.file_size(size_ec));
    if (size_ec) continue;
    segments.push_back({entry.path().string(), size});
    total += size;
  }
  // names start with the UTC start time: oldest first
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.name < b.name; });
  for (const auto& s : segments) {
    if (total <= options_.max_bytes) break;
    if (s.name == segment_path_) continue;
    if (fs::remove(s.name, ec)) total -= s.size;
  }
}

// Writes whole lines; a failed write closes the segment (the next batch
// opens a new one, so a torn tail is never followed by a record).
void PredictionLog::Append(const std::string& lines) {
  if (lines.empty()) return;
  if (fd_ < 0 && !OpenSegment().ok()) {
    const auto n = std::count(lines.begin(), lines.end(), '\n');
    if (dropped_write_ != nullptr) dropped_write_->Increment(static_cast<double>(n));
    return;
  }
  size_t offset = 0;
  while (offset < lines.size()) {
    const ssize_t n = ::write(fd_, lines.data() + offset, lines.size() - offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const auto lost = std::count(lines.begin() + static_cast<long>(offset),
                                   lines.end(), '\n');
      if (dropped_write_ != nullptr) dropped_write_->Increment(static_cast<double>(lost));
      LogWarn("prediction log write failed",
              {{"file", segment_path_}, {"error", std::strerror(errno)}});
      ::close(fd_);
      fd_ = -1;
      return;
    }
    offset += static_cast<size_t>(n);
  }
  segment_size_ += static_cast<int64_t>(lines.size());
  if (written_ != nullptr) {
    written_->Increment(
        static_cast<double>(std::count(lines.begin(), lines.end(), '\n')));
  }
}

void PredictionLog::WriterLoop() {
  std::deque<PredictionRecord> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Woken by a filling queue, a flush or a stop; otherwise it looks
      // every kWriterPeriod: no wake-up call per request.
      cv_.wait_for(lock, kWriterPeriod, [this] {
        return stop_ || flush_ || static_cast<int64_t>(queue_.size()) >= wake_at_;
      });
      flush_ = false;
      if (queue_.empty()) {
        if (stop_) return;
        continue;
      }
      batch.swap(queue_);
    }
    std::string pending;
    std::string data;
    std::string line;
    bool rotated = false;
    for (const auto& record : batch) {
      data.clear();
      line.clear();
      AppendData(&data, record);
      AppendEventLine(&line, record, data, &time_format_);
      if (segment_size_ + static_cast<int64_t>(pending.size() + line.size()) >
              options_.segment_bytes &&
          segment_size_ + static_cast<int64_t>(pending.size()) > 0) {
        Append(pending);
        pending.clear();
        (void)OpenSegment();
        rotated = true;
      }
      pending += line;
      if (!options_.sink_url.empty()) {
        std::lock_guard<std::mutex> lock(sink_mu_);
        if (static_cast<int64_t>(sink_queue_.size()) >= options_.queue_size) {
          if (dropped_sink_queue_ != nullptr) dropped_sink_queue_->Increment();
        } else {
          sink_queue_.emplace_back(EventHeaders(record), data);
          sink_cv_.notify_one();
        }
      }
    }
    Append(pending);
    if (rotated) EnforceBound();
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ += batch.size();
    }
    idle_cv_.notify_all();
    batch.clear();
  }
}

void PredictionLog::SinkLoop() {
  const Url url = *ParseHttpUrl(options_.sink_url);
  net::io_context io;
  std::optional<beast::tcp_stream> stream;
  for (;;) {
    std::pair<std::string, std::string> event;
    {
      std::unique_lock<std::mutex> lock(sink_mu_);
      sink_cv_.wait(lock, [this] { return sink_stop_ || !sink_queue_.empty(); });
      if (sink_queue_.empty()) return;
      event = std::move(sink_queue_.front());
      sink_queue_.pop_front();
    }
    http::request<http::string_body> req{http::verb::post, url.target, 11};
    req.set(http::field::host, url.host + ":" + url.port);
    req.set(http::field::content_type, "application/json");
    std::string_view headers = event.first;
    while (!headers.empty()) {
      const auto k_end = headers.find('\n');
      const auto v_end = headers.find('\n', k_end + 1);
      req.set(headers.substr(0, k_end),
              headers.substr(k_end + 1, v_end - k_end - 1));
      headers.remove_prefix(v_end + 1);
    }
    req.body() = std::move(event.second);
    req.keep_alive(true);
    req.prepare_payload();
    bool ok = false;
    for (int attempt = 0; attempt < 2 && !ok; ++attempt) {
      try {
        if (!stream) {
          stream.emplace(io);
          stream->expires_after(std::chrono::milliseconds(options_.sink_timeout_ms));
          net::ip::tcp::resolver resolver(io);
          stream->connect(resolver.resolve(url.host, url.port));
        }
        stream->expires_after(std::chrono::milliseconds(options_.sink_timeout_ms));
        http::write(*stream, req);
        beast::flat_buffer buffer;
        http::response<http::string_body> res;
        http::read(*stream, buffer, res);
        ok = res.result_int() / 100 == 2;
        if (!res.keep_alive()) stream.reset();
        if (!ok) break;  // the sink answered: no retry
      } catch (const std::exception& e) {
        stream.reset();  // a stale keep-alive connection: retry once
      }
    }
    if (ok) {
      if (sink_sent_ != nullptr) sink_sent_->Increment();
    } else if (dropped_sink_ != nullptr) {
      dropped_sink_->Increment();
    }
  }
}

}  // namespace serving

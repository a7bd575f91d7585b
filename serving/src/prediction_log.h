// The prediction log: one record per answered inference request, written
// off the request path to a size-bounded, rotating directory of JSON Lines
// segments (one CloudEvents 1.0 structured-mode event per line, type
// org.kubeflow.serving.inference.response as KServe's logger sends), and
// optionally POSTed to a sink URL as CloudEvents in binary mode (ce-*
// headers, as KServe's logger does).
//
// It never slows or fails inference: Submit() only moves a record into a
// bounded queue; when the queue is full the record is dropped and counted
// (serving_prediction_log_dropped_total{reason="queue_full"}). One writer
// thread formats and appends whole lines; a reader accepts a line only when
// it ends in '\n' and parses, so a SIGKILL can leave at most an unterminated
// last line, which is never accepted. Every process start writes new
// segment files, so a torn tail is never followed by new records.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "status.h"
#include "tensor.h"

namespace serving {

class Counter;
class Registry;

// RFC 3339 UTC time with microseconds, the date part cached per second.
class TimeFormat {
 public:
  void Append(std::string* out, int64_t time_us);

 private:
  int64_t cached_sec_ = -1;
  std::string cached_;
};

struct PredictionLogOptions {
  std::string dir;                     // empty: no log
  int64_t max_bytes = 1ll << 30;       // all segments in `dir` together
  int64_t segment_bytes = 64ll << 20;  // a segment is closed past this
  int64_t queue_size = 8192;           // records waiting for the writer
  std::string sink_url;                // http://host[:port]/path, or empty
  int64_t sink_timeout_ms = 2000;
};

// What the request path hands over (cheap: a summary, not the outputs).
struct PredictionRecord {
  std::string id;       // the request id (the client's, or generated)
  std::string model;
  std::string version;
  std::string role;     // "" (the one served version), champion, challenger
  bool answered = true; // false: this version's answer went to no client
  int64_t time_us = 0;  // system clock, when the request arrived
  int64_t latency_us = 0;
  int code = 200;       // HTTP-style status of the answer
  std::string error;
  int64_t batch = 0;
  // Classifiers: per item, the top-1 class and its softmax probability.
  std::vector<int64_t> top1;
  std::vector<float> confidence;
  // Other models: per item, the mean of the first output.
  std::vector<float> output_mean;
  // The inputs, when this request was sampled (raw bytes, base64 in JSON).
  std::vector<Tensor> inputs;
};

class PredictionLog {
 public:
  // Creates `options.dir` if needed and starts the writer (and sink) thread.
  static StatusOr<std::unique_ptr<PredictionLog>> Open(
      const PredictionLogOptions& options, Registry* registry);
  ~PredictionLog();  // writes what is queued, then stops

  // Never blocks on I/O; false when the queue was full (record dropped).
  bool Submit(PredictionRecord record);
  // Blocks until everything submitted so far is written (tests, shutdown).
  void Flush();

  const PredictionLogOptions& options() const { return options_; }

 private:
  explicit PredictionLog(PredictionLogOptions options);
  void WriterLoop();
  void SinkLoop();
  Status OpenSegment();
  void Append(const std::string& lines);
  void EnforceBound();

  const PredictionLogOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<PredictionRecord> queue_;
  uint64_t submitted_ = 0;
  uint64_t done_ = 0;
  bool stop_ = false;
  bool flush_ = false;
  const int64_t wake_at_;  // queue length that wakes the writer early

  int fd_ = -1;
  int64_t segment_size_ = 0;
  int64_t segment_seq_ = 0;
  std::string segment_path_;
  std::string prefix_;  // predictions-<utc start>-<host>-<pid>-
  TimeFormat time_format_;

  // sink: serialized events waiting to be POSTed
  std::mutex sink_mu_;
  std::condition_variable sink_cv_;
  std::deque<std::pair<std::string, std::string>> sink_queue_;  // headers, body
  bool sink_stop_ = false;

  Counter* written_ = nullptr;
  Counter* dropped_queue_ = nullptr;
  Counter* dropped_write_ = nullptr;
  Counter* dropped_sink_ = nullptr;
  Counter* dropped_sink_queue_ = nullptr;
  Counter* sink_sent_ = nullptr;
  Counter* rotated_ = nullptr;

  std::thread writer_;
  std::thread sink_;
};

// A random RFC 4122 version-4 UUID (request ids the client did not give).
std::string NewRequestId();

// Standard base64 (RFC 4648, padded).
std::string Base64Encode(const char* data, size_t size);

}  // namespace serving

#include "config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>

namespace serving {
namespace {

enum class Kind { kString, kInt, kBool, kDouble };

struct Flag {
  const char* name;
  Kind kind;
  const char* help;
  const char* legacy_env;  // fallback env var (KServe), or nullptr
  std::function<Status(ServerConfig*, const std::string&)> set;
  std::function<std::string(const ServerConfig&)> get;
};

Status ParseInt(const std::string& flag, const std::string& text,
                int64_t min_value, int64_t* out) {
  int64_t value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto res = std::from_chars(begin, end, value);
  if (text.empty() || res.ec != std::errc() || res.ptr != end) {
    return InvalidArgument("--" + flag + ": '" + text + "' is not an integer");
  }
  if (value < min_value) {
    return InvalidArgument("--" + flag + ": must be >= " +
                           std::to_string(min_value) + ", got " + text);
  }
  *out = value;
  return Status::Ok();
}

Status ParseBool(const std::string& flag, const std::string& text, bool* out) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") {
    *out = true;
  } else if (lower == "0" || lower == "false" || lower == "no" ||
             lower == "off") {
    *out = false;
  } else {
    return InvalidArgument("--" + flag + ": '" + text + "' is not a boolean");
  }
  return Status::Ok();
}

Status OneOf(const std::string& flag, const std::string& text,
             const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    if (text == a) return Status::Ok();
  }
  std::string list;
  for (const auto& a : allowed)
    list += (list.empty() ? "" : "|") + a;
  return InvalidArgument("--" + flag + ": '" + text + "' is not one of " +
                         list);
}

Flag StringFlag(const char* name, const char* help,
                std::string ServerConfig::*m,
                std::vector<std::string> allowed = {},
                const char* legacy_env = nullptr) {
  return Flag{name,
              Kind::kString,
              help,
              legacy_env,
              [name, m, allowed](ServerConfig* c, const std::string& v) {
                if (!allowed.empty()) RETURN_IF_ERROR(OneOf(name, v, allowed));
                c->*m = v;
                return Status::Ok();
              },
              [m](const ServerConfig& c) { return c.*m; }};
}

template <typename T>
Flag IntFlag(const char* name, const char* help, T ServerConfig::*m,
             int64_t min_value, const char* legacy_env = nullptr) {
  return Flag{
      name,
      Kind::kInt,
      help,
      legacy_env,
      [name, m, min_value](ServerConfig* c, const std::string& v) {
        int64_t parsed = 0;
        RETURN_IF_ERROR(ParseInt(name, v, min_value, &parsed));
        if (parsed > static_cast<int64_t>(std::numeric_limits<T>::max())) {
          return InvalidArgument(std::string("--") + name +
                                 ": value too large");
        }
        c->*m = static_cast<T>(parsed);
        return Status::Ok();
      },
      [m](const ServerConfig& c) { return std::to_string(c.*m); }};
}

// A number in [0, 1] (a rate).
Flag RateFlag(const char* name, const char* help, double ServerConfig::*m) {
  return Flag{name,
              Kind::kDouble,
              help,
              nullptr,
              [name, m](ServerConfig* c, const std::string& v) {
                double parsed = 0;
                const char* end = v.data() + v.size();
                auto res = std::from_chars(v.data(), end, parsed);
                if (v.empty() || res.ec != std::errc() || res.ptr != end) {
                  return InvalidArgument(std::string("--") + name + ": '" + v +
                                         "' is not a number");
                }
                if (!(parsed >= 0.0 && parsed <= 1.0)) {
                  return InvalidArgument(std::string("--") + name +
                                         ": must be in [0, 1], got " + v);
                }
                c->*m = parsed;
                return Status::Ok();
              },
              [m](const ServerConfig& c) {
                std::ostringstream out;
                out << c.*m;
                return out.str();
              }};
}

Flag BoolFlag(const char* name, const char* help, bool ServerConfig::*m) {
  return Flag{name,
              Kind::kBool,
              help,
              nullptr,
              [name, m](ServerConfig* c, const std::string& v) {
                bool parsed = false;
                RETURN_IF_ERROR(ParseBool(name, v, &parsed));
                c->*m = parsed;
                return Status::Ok();
              },
              [m](const ServerConfig& c) {
                return std::string(c.*m ? "true" : "false");
              }};
}

const std::vector<std::string>& PerModelFlags() {
  static const std::vector<std::string> names = {
      "workers",        "threads-per-worker", "max-batch-size",
      "max-queue-delay-us", "dynamic-batching", "max-queue-size",
      "request-timeout-ms", "precision",      "cpu-pinning",
      "log-input-rate"};
  return names;
}

std::string Underscored(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

const std::vector<Flag>& Flags() {
  static const std::vector<Flag> flags = {
      StringFlag("model-dir", "exported model directory holding signature.json",
                 &ServerConfig::model_dir, {}, "MODEL_DIR"),
      StringFlag("model-name",
                 "served model name (default: <signature task>-classifier)",
                 &ServerConfig::model_name, {}, "MODEL_NAME"),
      StringFlag("model-version", "served model version",
                 &ServerConfig::model_version),
      StringFlag("variant",
                 "fp32: formats.legacy.program, int8: "
                 "formats.int8_openvino.program (paddle backend: "
                 "formats.int8_paddle)",
                 &ServerConfig::variant, {"fp32", "int8"}),
      StringFlag("model-file",
                 "model program to load instead of the signature's "
                 "(.pdmodel, .json or OpenVINO .xml)",
                 &ServerConfig::model_file),
      StringFlag("params-file",
                 "weights for --model-file (paddle backend; OpenVINO finds "
                 "them next to the program)",
                 &ServerConfig::params_file),
      StringFlag("backend", "inference runtime", &ServerConfig::backend,
                 {"openvino", "paddle"}),
      StringFlag("device",
                 "OpenVINO device (CPU, GPU, AUTO...) or, for the paddle "
                 "backend, cpu | gpu | gpu:N",
                 &ServerConfig::device),
      StringFlag("precision",
                 "OpenVINO CPU inference precision hint (f32 matches Paddle; "
                 "auto lets AMX CPUs run bf16)",
                 &ServerConfig::precision,
                 {std::begin(kPrecisionValues), std::end(kPrecisionValues)}),
      BoolFlag("cpu-pinning",
               "OpenVINO CPU: pin inference threads to cores (costs two "
               "sched_setaffinity calls per inference; off suits a server "
               "sharing its cores with I/O threads)",
               &ServerConfig::cpu_pinning),
      BoolFlag("paddle-tensorrt",
               "paddle backend on GPU: enable the TensorRT subgraph engine",
               &ServerConfig::paddle_tensorrt),
      IntFlag("gpu-memory-mb", "paddle backend: initial GPU memory pool (MB)",
              &ServerConfig::gpu_memory_mb, 1),
      IntFlag("workers",
              "inference workers, each with its own infer request / "
              "predictor clone",
              &ServerConfig::workers, kMinWorkers),
      IntFlag("threads-per-worker",
              "CPU threads per worker (0: runtime default)",
              &ServerConfig::threads_per_worker, kMinThreadsPerWorker),
      IntFlag("max-batch-size",
              "largest batch (samples, dim 0) run at once; larger requests "
              "get 400",
              &ServerConfig::max_batch_size, kMinMaxBatchSize),
      IntFlag("max-queue-delay-us",
              "the longest a free worker waits for clients it just answered "
              "to send their next request (0: never; a lone request never "
              "waits)",
              &ServerConfig::max_queue_delay_us, kMinMaxQueueDelayUs),
      BoolFlag("dynamic-batching",
               "merge concurrent requests into batches (false: each request "
               "runs alone)",
               &ServerConfig::dynamic_batching),
      IntFlag("max-queue-size",
              "requests waiting for a worker at most; more get 503 (0: no "
              "bound)",
              &ServerConfig::max_queue_size, kMinMaxQueueSize),
      IntFlag("request-timeout-ms",
              "time from enqueue to completion before a 504",
              &ServerConfig::request_timeout_ms, kMinRequestTimeoutMs),
      BoolFlag("model-control",
               "allow POST v2/repository/models/{name}/load and /unload "
               "(a load builds the new version while the current one "
               "serves, then swaps it in)",
               &ServerConfig::model_control),
      StringFlag("host", "listen address", &ServerConfig::host),
      IntFlag("port", "HTTP listen port (0: any free port)",
              &ServerConfig::port, 0, "PORT"),
      IntFlag("grpc-port",
              "KServe v2 gRPC listen port (0: any free port, -1: no gRPC)",
              &ServerConfig::grpc_port, -1),
      IntFlag("http-threads",
              "HTTP event-loop threads; connections cost memory, not "
              "threads, and inference runs on the workers",
              &ServerConfig::http_threads, 1),
      IntFlag("max-connections",
              "open HTTP connections at most; more are answered 503 and "
              "closed",
              &ServerConfig::max_connections, 1),
      IntFlag("header-timeout-ms",
              "time a client has to send a request's headers (from its "
              "first byte on a new connection); slow clients are closed",
              &ServerConfig::header_timeout_ms, 1),
      IntFlag("body-timeout-ms",
              "time a client has to send a request body once its headers "
              "arrived",
              &ServerConfig::body_timeout_ms, 1),
      IntFlag("max-body-bytes", "largest request body; larger ones get 413",
              &ServerConfig::max_body_bytes, 1),
      IntFlag("lingering-close-bytes",
              "after a 413, read and discard at most this much of the "
              "refused body before closing, so the client gets to read the "
              "answer instead of a reset (0: close at once)",
              &ServerConfig::lingering_close_bytes, 0),
      IntFlag("lingering-close-ms",
              "after a 413, drain the refused body at most this long",
              &ServerConfig::lingering_close_ms, 0),
      IntFlag("keep-alive-max-count",
              "requests served on one keep-alive connection",
              &ServerConfig::keep_alive_max_count, 1),
      IntFlag("keep-alive-timeout-s",
              "idle seconds between requests before a keep-alive "
              "connection is closed",
              &ServerConfig::keep_alive_timeout_s, 1),
      IntFlag("drain-delay-ms",
              "on SIGTERM, keep serving (ready = 503) this long before "
              "closing the listener",
              &ServerConfig::drain_delay_ms, 0),
      StringFlag("prediction-log-dir",
                 "write one CloudEvents JSON line per answered inference "
                 "request into this directory (empty: no prediction log)",
                 &ServerConfig::prediction_log_dir),
      IntFlag("prediction-log-max-bytes",
              "the prediction log directory's segments together at most; "
              "the oldest are deleted",
              &ServerConfig::prediction_log_max_bytes, 1024),
      IntFlag("prediction-log-segment-bytes",
              "a prediction log segment file is closed past this size",
              &ServerConfig::prediction_log_segment_bytes, 1024),
      IntFlag("prediction-log-queue-size",
              "records waiting for the log writer at most; more are dropped "
              "and counted (serving_prediction_log_dropped_total)",
              &ServerConfig::prediction_log_queue_size, 1),
      StringFlag("prediction-log-sink",
                 "also POST each record as a CloudEvent (binary mode, ce-* "
                 "headers like KServe's logger) to this http:// URL",
                 &ServerConfig::prediction_log_sink),
      RateFlag("log-input-rate",
               "share of requests whose input tensors the prediction log "
               "keeps (0..1; outputs are always logged)",
               &ServerConfig::log_input_rate),
      StringFlag("challenger-model-dir",
                 "also load this version beside the model as a challenger "
                 "(a Kubernetes pod's way; with --model-control: the "
                 "repository API's load with role challenger)",
                 &ServerConfig::challenger_model_dir),
      StringFlag("challenger-version", "the challenger's version",
                 &ServerConfig::challenger_version),
      StringFlag("challenger-policy",
                 "shadow: the challenger also runs a share of the requests, "
                 "clients get the model's answer; canary: it answers them",
                 &ServerConfig::challenger_policy, {"shadow", "canary"}),
      RateFlag("challenger-fraction",
               "the share of requests the challenger runs (0 < f <= 1)",
               &ServerConfig::challenger_fraction),
      StringFlag("log-level", "debug | info | warn | error",
                 &ServerConfig::log_level, {"debug", "info", "warn", "error"}),
      BoolFlag("access-log", "log one JSON line per HTTP request",
               &ServerConfig::access_log),
  };
  return flags;
}

const Flag* FindFlag(const std::string& name) {
  for (const auto& flag : Flags()) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

bool LooksLikeBool(const std::string& text) {
  bool ignored = false;
  return ParseBool("", text, &ignored).ok();
}

}  // namespace

std::string EnvNameForFlag(const std::string& flag) {
  std::string env = "SERVING_";
  for (char c : flag) {
    env += c == '-'
               ? '_'
               : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return env;
}

std::string Usage() {
  std::ostringstream out;
  const ServerConfig defaults;
  out << "usage: paddle-mlops-server [--flag=value ...]\n\n"
      << "KServe v2 (Open Inference Protocol) REST server for an exported "
         "PaddlePaddle model.\n"
      << "Every flag can also be set with its environment variable; flags "
         "win.\n"
      << "Flags marked (model) may also come from <model-dir>/"
      << kModelConfigFile << " (key: the flag with '_' for '-');\n"
      << "flag > environment > " << kModelConfigFile
      << " > default.\n\n";
  const auto per_model = PerModelFlags();
  for (const auto& flag : Flags()) {
    std::string env = EnvNameForFlag(flag.name);
    if (flag.legacy_env != nullptr) env += ", " + std::string(flag.legacy_env);
    std::string def = flag.get(defaults);
    const bool model = std::find(per_model.begin(), per_model.end(),
                                 std::string(flag.name)) != per_model.end();
    out << "  --" << flag.name << (model ? " (model)" : "") << "  [" << env
        << "]"
        << (def.empty() ? "" : "  default: " + def) << "\n      " << flag.help
        << "\n";
  }
  return out.str();
}

StatusOr<ServerConfig> ParseConfig(const std::vector<std::string>& args,
                                   const EnvLookup& env, bool* help) {
  *help = false;
  for (const auto& arg : args) {
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return ServerConfig();
    }
  }
  ServerConfig config;
  // Environment first (SERVING_* before the KServe names), then flags.
  for (const auto& flag : Flags()) {
    const std::string env_name = EnvNameForFlag(flag.name);
    const char* value = env ? env(env_name.c_str()) : nullptr;
    std::string source = env_name;
    if ((value == nullptr || *value == '\0') && flag.legacy_env != nullptr &&
        env) {
      value = env(flag.legacy_env);
      source = flag.legacy_env;
    }
    if (value == nullptr || *value == '\0') continue;
    Status status = flag.set(&config, value);
    if (!status.ok()) {
      return InvalidArgument("environment " + source + ": " + status.message());
    }
    config.explicit_flags.insert(flag.name);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return InvalidArgument("unexpected argument '" + arg +
                             "' (flags look like --name=value)");
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Flag* flag = FindFlag(name);
    if (flag == nullptr && value == std::nullopt && name.rfind("no-", 0) == 0) {
      const Flag* negated = FindFlag(name.substr(3));
      if (negated != nullptr && negated->kind == Kind::kBool) {
        RETURN_IF_ERROR(negated->set(&config, "false"));
        config.explicit_flags.insert(negated->name);
        continue;
      }
    }
    if (flag == nullptr) {
      return InvalidArgument("unknown flag --" + name + " (see --help)");
    }
    if (!value.has_value()) {
      if (flag->kind == Kind::kBool) {
        if (i + 1 < args.size() && LooksLikeBool(args[i + 1])) {
          value = args[++i];
        } else {
          value = "true";
        }
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return InvalidArgument("--" + name + " needs a value");
      }
    }
    RETURN_IF_ERROR(flag->set(&config, *value));
    config.explicit_flags.insert(flag->name);
  }
  if (config.port > 65535) {
    return InvalidArgument("--port: " + std::to_string(config.port) +
                           " is not a TCP port");
  }
  if (config.model_version.empty()) {
    return InvalidArgument("--model-version must not be empty");
  }
  return config;
}


std::vector<std::string> PerModelSettings() {
  std::vector<std::string> out;
  for (const auto& name : PerModelFlags()) out.push_back(Underscored(name));
  return out;
}

StatusOr<ServerConfig> ApplyModelConfig(const ServerConfig& config) {
  const std::string path = config.model_dir + "/" + kModelConfigFile;
  std::ifstream in(path);
  if (!in) return config;  // no file: built-in defaults and the operator's
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object()) {
    return InvalidArgument(path + ": top level must be an object of settings");
  }
  ServerConfig out = config;
  for (const auto& [key, value] : doc.items()) {
    std::string name = key;
    std::replace(name.begin(), name.end(), '_', '-');
    const bool per_model =
        std::find(PerModelFlags().begin(), PerModelFlags().end(), name) !=
        PerModelFlags().end();
    const Flag* flag = per_model ? FindFlag(name) : nullptr;
    if (flag == nullptr) {
      std::string known;
      for (const auto& s : PerModelSettings()) known += (known.empty() ? "" : ", ") + s;
      return InvalidArgument(path + ": field '" + key +
                             "': not a per-model setting (one of: " + known + ")");
    }
    std::string text;
    if (flag->kind == Kind::kInt && value.is_number_integer()) {
      text = std::to_string(value.get<int64_t>());
    } else if (flag->kind == Kind::kBool && value.is_boolean()) {
      text = value.get<bool>() ? "true" : "false";
    } else if (flag->kind == Kind::kString && value.is_string()) {
      text = value.get<std::string>();
    } else if (flag->kind == Kind::kDouble && value.is_number()) {
      text = value.dump();
    } else {
      const char* want = flag->kind == Kind::kInt      ? "an integer"
                         : flag->kind == Kind::kBool   ? "true or false"
                         : flag->kind == Kind::kDouble ? "a number"
                                                       : "a string";
      return InvalidArgument(path + ": field '" + key + "': must be " + want +
                             ", got " + value.dump());
    }
    // Checked even where the operator's flag wins: a bad file is an error.
    ServerConfig scratch = out;
    Status status = flag->set(&scratch, text);
    if (status.ok() && config.explicit_flags.count(name) == 0) {
      status = flag->set(&out, text);  // operator's flag/environment wins
    }
    if (!status.ok()) {
      // "--max-batch-size: must be >= 1, got 0" -> the file's field
      std::string rule = status.message();
      const auto colon = rule.find(": ");
      if (colon != std::string::npos) rule = rule.substr(colon + 2);
      return InvalidArgument(path + ": field '" + key + "': " + rule);
    }
  }
  return out;
}

nlohmann::json PerModelJson(const ServerConfig& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& name : PerModelFlags()) {
    const Flag* flag = FindFlag(name);
    const std::string text = flag->get(config);
    if (flag->kind == Kind::kInt) {
      out[Underscored(name)] = std::stoll(text);
    } else if (flag->kind == Kind::kBool) {
      out[Underscored(name)] = text == "true";
    } else if (flag->kind == Kind::kDouble) {
      out[Underscored(name)] = std::stod(text);
    } else {
      out[Underscored(name)] = text;
    }
  }
  return out;
}

}  // namespace serving

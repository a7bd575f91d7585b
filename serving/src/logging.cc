#include "logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace serving {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_write_mu;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

std::string Timestamp() {
  using std::chrono::system_clock;
  const auto now = system_clock::now();
  const std::time_t secs = system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                          now.time_since_epoch())
                          .count() %
                      1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<int>(millis));
  return buf;
}

}  // namespace

bool ParseLogLevel(const std::string& text, LogLevel* level) {
  if (text == "debug") {
    *level = LogLevel::kDebug;
  } else if (text == "info") {
    *level = LogLevel::kInfo;
  } else if (text == "warn" || text == "warning") {
    *level = LogLevel::kWarn;
  } else if (text == "error") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

void SetLogLevel(LogLevel level) {
  g_level = static_cast<int>(level);
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level;
}

std::string FormatLogLine(LogLevel level, const std::string& msg,
                          const nlohmann::json& fields) {
  // Built by hand so that ts, level and msg come first; invalid UTF-8 (e.g. a
  // garbage request path) is replaced, never thrown.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  std::string line =
      "{\"ts\":\"" + Timestamp() + "\",\"level\":\"" + LevelName(level) +
      "\",\"msg\":" + nlohmann::json(msg).dump(-1, ' ', false, kReplace);
  if (fields.is_object()) {
    for (auto it = fields.begin(); it != fields.end(); ++it) {
      std::string key = it.key();
      if (key == "ts" || key == "level" || key == "msg") key = "field_" + key;
      line += "," + nlohmann::json(key).dump(-1, ' ', false, kReplace) + ":" +
              it.value().dump(-1, ' ', false, kReplace);
    }
  }
  line += "}";
  return line;
}

void Log(LogLevel level, const std::string& msg, const nlohmann::json& fields) {
  if (!LogEnabled(level)) return;
  std::string out = FormatLogLine(level, msg, fields);
  out.push_back('\n');
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace serving

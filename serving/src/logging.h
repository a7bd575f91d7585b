// Structured logging: one JSON object per line on stderr.
//   {"ts":"2025-01-01T00:00:00.123Z","level":"info","msg":"...", <fields>...}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace serving {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Parses "debug" | "info" | "warn" | "error"; false if unknown.
bool ParseLogLevel(const std::string& text, LogLevel* level);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

// Writes one line atomically (thread-safe). `fields` must be a JSON object
// (or null); its keys are merged into the top-level object.
void Log(LogLevel level, const std::string& msg,
         const nlohmann::json& fields = nullptr);

// Renders the line without writing it (used by Log and by tests).
std::string FormatLogLine(LogLevel level, const std::string& msg,
                          const nlohmann::json& fields);

inline void LogDebug(const std::string& msg,
                     const nlohmann::json& fields = nullptr) {
  if (LogEnabled(LogLevel::kDebug)) Log(LogLevel::kDebug, msg, fields);
}
inline void LogInfo(const std::string& msg,
                    const nlohmann::json& fields = nullptr) {
  Log(LogLevel::kInfo, msg, fields);
}
inline void LogWarn(const std::string& msg,
                    const nlohmann::json& fields = nullptr) {
  Log(LogLevel::kWarn, msg, fields);
}
inline void LogError(const std::string& msg,
                     const nlohmann::json& fields = nullptr) {
  Log(LogLevel::kError, msg, fields);
}

}  // namespace serving

// record_error(), read_error_file(); see lockstep/error_file.h.
#include "lockstep/error_file.h"

#include <cstdlib>
#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/file.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

// The name a Python user would see for the error's class.
const char* type_name(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return "lockstep.TimeoutError";
  if (dynamic_cast<const PeerError*>(&e)) return "lockstep.PeerError";
  if (dynamic_cast<const MismatchError*>(&e)) return "lockstep.MismatchError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "lockstep.InvalidArgument";
  if (dynamic_cast<const ConfigError*>(&e)) return "lockstep.ConfigError";
  if (dynamic_cast<const Error*>(&e)) return "lockstep.Error";
  return "std::exception";
}

}  // namespace

void record_error(const std::exception& e) noexcept {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  try {
    nlohmann::json file;
    file["message"]["message"] = std::string(type_name(e)) + ": " + e.what();
    file["message"]["extraInfo"]["timestamp"] = std::to_string(std::time(nullptr));
    write_file_atomically(path, file.dump(2) + "\n");
  } catch (...) {
    // Recording is best effort: the caller is already failing, and its own
    // message on stderr still reaches the launcher.
  }
}

std::optional<std::string> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json file = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!file.is_object() || !file.contains("message")) return std::nullopt;
  const nlohmann::json& message = file["message"];
  // torchrun's handler nests the text in an object; a plain string is what
  // some writers put there.
  if (message.is_string()) return message.get<std::string>();
  if (message.is_object() && message.contains("message") && message["message"].is_string())
    return message["message"].get<std::string>();
  return std::nullopt;
}

}  // namespace lockstep

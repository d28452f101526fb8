// The launcher's compound arguments; see run_arguments.h.
#include "run/run_arguments.h"

#include <signal.h>
#include <string.h>

#include <fmt/format.h>

#include "common/env.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t end = text.find(sep, pos);
    parts.push_back(text.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) return parts;
    pos = end + 1;
  }
}

int parse_count(const std::string& text, const std::string& what, int low, int high) {
  const auto n = parse_int(text);
  if (!n || *n < low || *n > high)
    throw ConfigError(fmt::format("{}: '{}' is not a number from {} to {}", what, text, low, high));
  return static_cast<int>(*n);
}

double parse_seconds(const std::string& text, const std::string& what) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && v >= 0 && v <= 604800) return v;
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("{}: '{}' is not a number of seconds (0 to 604800)", what, text));
}

}  // namespace

std::vector<std::string> separate_program(const CLI::App& run, std::vector<std::string> args, std::size_t first) {
  for (std::size_t i = first; i < args.size();) {
    const std::string& a = args[i];
    if (a == "--") return args;
    if (a.size() < 2 || a[0] != '-') {
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i), "--");
      return args;
    }
    const std::size_t eq = a.find('=');
    const CLI::Option* option = run.get_option_no_throw(a.substr(0, eq));
    // "--opt value" takes two words; "--opt=value", a flag, or an option
    // the launcher does not know (CLI11 will say so) take one.
    const bool takes_value = option != nullptr && eq == std::string::npos && option->get_expected_min() > 0;
    i += takes_value ? 2 : 1;
  }
  return args;
}

NodeRange parse_nnodes(const std::string& text) {
  constexpr int kMaxNodes = 1 << 16;
  const auto parts = split(text, ':');
  if (parts.size() > 2) throw ConfigError(fmt::format("--nnodes '{}' is neither N nor MIN:MAX", text));
  NodeRange range;
  range.min = parse_count(parts[0], "--nnodes", 1, kMaxNodes);
  range.written_as_range = parts.size() == 2;
  range.max = range.written_as_range ? parse_count(parts[1], "--nnodes", 1, kMaxNodes) : range.min;
  if (range.min > range.max)
    throw ConfigError(fmt::format("--nnodes {}: the minimum {} is above the maximum {}", text, range.min, range.max));
  return range;
}

Endpoint parse_endpoint(const std::string& text) {
  Endpoint e;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string::npos) throw ConfigError(fmt::format("--rdzv-endpoint '{}' lacks its ']'", text));
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw ConfigError(fmt::format("--rdzv-endpoint '{}' is not [host]:port", text));
      port = text.substr(close + 2);
    }
  } else if (const std::size_t colon = text.rfind(':'); colon != std::string::npos && text.find(':') == colon) {
    e.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  } else {
    e.host = text;
  }
  if (e.host.empty()) throw ConfigError(fmt::format("--rdzv-endpoint '{}' names no host", text));
  if (!port.empty()) e.port = parse_count(port, "--rdzv-endpoint's port", 1, 65535);
  return e;
}

RendezvousConf parse_rdzv_conf(const std::string& text) {
  RendezvousConf conf;
  if (text.empty()) return conf;
  for (const auto& item : split(text, ',')) {
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "join_timeout") {
      conf.join_timeout = parse_seconds(value, "--rdzv-conf join_timeout");
    } else if (key == "last_call_timeout") {
      conf.last_call_timeout = parse_seconds(value, "--rdzv-conf last_call_timeout");
    } else if (key == "keep_alive_interval") {
      conf.keep_alive_interval = parse_seconds(value, "--rdzv-conf keep_alive_interval");
      if (conf.keep_alive_interval < 0.01)
        throw ConfigError(fmt::format("--rdzv-conf keep_alive_interval: '{}' is below 0.01 s", value));
    } else if (key == "keep_alive_max_attempt") {
      conf.keep_alive_max_attempt = parse_count(value, "--rdzv-conf keep_alive_max_attempt", 1, 1000);
    } else if (key == "protocol") {
      if (value != "http" && value != "https")
        throw ConfigError(fmt::format("--rdzv-conf protocol: '{}' is neither http nor https", value));
      conf.protocol = value;
    } else if (key == "cacert" || key == "cert" || key == "key" || key == "username") {
      if (value.empty()) throw ConfigError(fmt::format("--rdzv-conf {}: no value given", key));
      (key == "cacert" ? conf.cacert : key == "cert" ? conf.cert : key == "key" ? conf.key : conf.username) = value;
    } else {
      throw ConfigError(fmt::format("--rdzv-conf: unknown key '{}'; lockstep knows join_timeout, "
                                    "last_call_timeout, keep_alive_interval (seconds) and keep_alive_max_attempt, "
                                    "and for etcd protocol, cacert, cert, key and username",
                                    key));
    }
  }
  return conf;
}

int stream_mask(const std::string& text, int local_rank, const char* option) {
  if (text.empty()) return kNoStream;
  if (text.find(':') == std::string::npos) return parse_count(text, option, 0, 3);
  int mask = kNoStream;
  for (const auto& item : split(text, ',')) {
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw ConfigError(fmt::format("{} '{}': '{}' is not local_rank:value", option, text, item));
    const int rank = parse_count(item.substr(0, colon), option, 0, 1 << 16);
    const int value = parse_count(item.substr(colon + 1), option, 0, 3);
    if (rank == local_rank) mask = value;
  }
  return mask;
}

std::vector<std::string> rank_command(const std::vector<std::string>& program, const EntryPoint& how) {
  if (program.empty()) throw ConfigError("no program to run; give its name after the launcher's options");
  if (how.module && how.no_python)
    throw ConfigError("-m runs a Python module and --no-python runs the program without Python; drop one");
  const std::string& name = program.front();
  const bool is_python_file = name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0;
  std::vector<std::string> command;
  if (how.run_path) {
    // As torchrun's --run-path: the interpreter runs the file through
    // runpy.run_path, with sys.argv as the script would see it.
    command = {"python3", "-u", "-c",
               "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"};
  } else if (how.module) {
    command = {"python3", "-u", "-m"};
  } else if (is_python_file && !how.no_python) {
    command = {"python3", "-u"};
  }
  command.insert(command.end(), program.begin(), program.end());
  return command;
}

std::vector<std::string> parse_filters(const std::string& text) {
  std::vector<std::string> filters;
  std::string current;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      current += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      current += ',';
      ++i;
    } else {
      if (!current.empty()) filters.push_back(current);
      current.clear();
    }
  }
  if (!current.empty()) filters.push_back(current);
  return filters;
}

std::vector<int> parse_local_ranks(const std::string& text) {
  std::vector<int> ranks;
  if (text.empty()) return ranks;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto n = parse_int(item);
    if (!n || *n < 0 || *n > (1 << 16))
      throw ConfigError(fmt::format("--local-ranks-filter '{}': '{}' is not a local rank; give them as 0,1,...", text,
                                    item));
    ranks.push_back(static_cast<int>(*n));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ranks;
}

namespace {

// The number of signal NAME ("TERM"), or 0.
int sig_number(const std::string& name) {
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev != nullptr && name == abbrev) return sig;
  }
  return 0;
}

}  // namespace

std::vector<int> parse_signals(const std::string& text) {
  std::vector<int> signals;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    std::string name = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    const int sig = name.empty() ? 0 : sig_number(name);
    if (sig <= 0)
      throw ConfigError(fmt::format("--signals-to-handle '{}': '{}' is not a signal name (e.g. SIGTERM,SIGUSR1)", text,
                                    text.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
      throw ConfigError(fmt::format("--signals-to-handle: SIG{} cannot be handled by the launcher", name));
    signals.push_back(sig);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return signals;
}

}  // namespace lockstep::cli

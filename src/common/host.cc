#include "common/host.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

namespace lockstep {

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

std::string random_hex(std::size_t bytes) {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  std::string out;
  for (std::size_t i = 0; i < bytes; ++i) out += fmt::format("{:02x}", static_cast<unsigned>(urandom.get()) & 0xff);
  return out;
}

}  // namespace lockstep

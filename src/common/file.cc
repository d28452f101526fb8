#include "common/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep {

void write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << contents;
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      throw Error(fmt::format("cannot write {}: {}", temp, std::strerror(errno)));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    throw Error(fmt::format("cannot rename {} to {}: {}", temp, path, std::strerror(err)));
  }
}

}  // namespace lockstep

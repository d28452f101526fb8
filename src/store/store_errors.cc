// Store timeout messages; see store_errors.h.
#include "store/store_errors.h"

#include <fmt/format.h>

#include "store/key_value_map.h"

namespace lockstep {

TimeoutError store_wait_timeout(const std::string& store_name, const std::vector<std::string>& missing,
                                Duration waited) {
  return TimeoutError(fmt::format(
      "{}: waited {:.1f} s for key(s) {} that were never set; a rank that should have set them "
      "is missing, slow to start or failed earlier (check its log), or the ranks disagree on the "
      "job (world size, run id)",
      store_name, static_cast<double>(waited.count()) / 1000.0, quote_keys(missing)));
}

}  // namespace lockstep

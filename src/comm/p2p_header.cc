#include "comm/p2p_header.h"

#include <fmt/format.h>

#include "common/format.h"
#include "lockstep/error.h"

namespace lockstep {

void throw_p2p_mismatch(const P2pHeader& header, const std::string& self, const OpContext& op, int src,
                        const Buffer& data, int tag) {
  throw MismatchError(fmt::format("{}: {} from rank {} expected tag {}, {} x {} ({} bytes), but rank {} sent tag {}, "
                                  "{} bytes of {}; make the send and the recv agree",
                                  self, op.description(), src, tag, data.count, data.dtype, data.bytes(), src,
                                  header.tag, header.bytes, static_cast<DType>(header.dtype)));
}

}  // namespace lockstep

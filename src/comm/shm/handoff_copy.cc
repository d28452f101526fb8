// Non-temporal copy for the shm slots (handoff_copy.h).
#include "comm/shm/handoff_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lockstep::shm {

#if defined(__x86_64__)
namespace {

// 16-byte streaming stores are in every x86-64 (SSE2); the write-combining
// buffers merge them into whole lines, so wider stores gain nothing here.
void stream_copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  // Ordinary stores up to dst's first 16-byte boundary.
  const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
  // Streaming stores are weakly ordered: without the fence, a peer could
  // see the round posted before the data.
  _mm_sfence();
}

}  // namespace
#endif

void copy_for_peer(void* dst, const void* src, std::size_t bytes, std::size_t streaming_from) {
#if defined(__x86_64__)
  if (streaming_from > 0 && bytes >= streaming_from && bytes >= 64) {
    stream_copy(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
    return;
  }
#else
  (void)streaming_from;
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace lockstep::shm

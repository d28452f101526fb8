// Receives from any source as every rank runs them: one receiver, every
// other rank a sender of numbered messages. Each message says who sent it
// and its number in every element, so the receiver checks the content, the
// source the Work reports, and each sender's order. Shared by the
// thread-rank tests (tcp, shm, hier) and the mpi tests (real MPI ranks).
// Thread-safe (no shared state).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::testing {

// Element i of message `number` from rank `sender`.
inline std::int64_t message_element(int sender, int number, std::size_t i) {
  return std::int64_t{sender} * 1'000'000'000 + std::int64_t{number} * 1'000'000 +
         static_cast<std::int64_t>(i % 1'000'000);
}

inline std::vector<std::int64_t> numbered_message(int sender, int number, std::size_t count) {
  std::vector<std::int64_t> message(count);
  for (std::size_t i = 0; i < count; ++i) message[i] = message_element(sender, number, i);
  return message;
}

// A sender's part: `messages` numbered messages of `count` elements to `to`.
inline void send_numbered_messages(ProcessGroup& pg, int to, int messages, std::size_t count, int tag = 0) {
  for (int m = 0; m < messages; ++m) {
    const auto message = numbered_message(pg.rank(), m, count);
    pg.send(ConstBuffer{message.data(), count, DType::i64}, to, tag)->wait();
  }
}

// Checks one received message against the source its Work reported and the
// number that sender's next message must have; returns "" or what is wrong.
inline std::string check_message(const std::vector<std::int64_t>& got, int source, int expected_number) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::int64_t want = message_element(source, expected_number, i);
    if (got[i] != want)
      return "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " + std::to_string(want) +
             " (message " + std::to_string(expected_number) + " of rank " + std::to_string(source) + ")";
  }
  return "";
}

// The receiver's part: (size - 1) x `messages` receives from any source, all
// issued at once and then waited for; every sender's messages must arrive
// whole, each once, in the order sent, with their sender reported.
inline void receive_from_every_sender(ProcessGroup& pg, int messages, std::size_t count, int tag = 0) {
  const int receives = (pg.size() - 1) * messages;
  std::vector<std::vector<std::int64_t>> buffers(static_cast<std::size_t>(receives),
                                                 std::vector<std::int64_t>(count, -1));
  std::vector<std::shared_ptr<Work>> works;
  for (auto& b : buffers) works.push_back(pg.recv_any(Buffer{b.data(), count, DType::i64}, tag));
  std::vector<int> next(static_cast<std::size_t>(pg.size()), 0);  // per sender, the number its next message has
  for (std::size_t k = 0; k < works.size(); ++k) {
    works[k]->wait();
    const int source = works[k]->source_rank();
    ASSERT_TRUE(source >= 0 && source < pg.size() && source != pg.rank()) << "receive " << k << ": source " << source;
    const std::string wrong = check_message(buffers[k], source, next[static_cast<std::size_t>(source)]++);
    ASSERT_EQ(wrong, "") << "receive " << k << " (" << count << " elements)";
  }
  for (int q = 0; q < pg.size(); ++q)
    if (q != pg.rank()) EXPECT_EQ(next[static_cast<std::size_t>(q)], messages) << "messages taken from rank " << q;
}

}  // namespace lockstep::testing

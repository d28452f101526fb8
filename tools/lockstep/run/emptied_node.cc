// await_round_outcome; see emptied_node.h.
#include "run/emptied_node.h"

#include <chrono>
#include <thread>

#include "lockstep/error.h"
#include "run/interruption.h"
#include "run/node_loss_watch.h"

namespace lockstep::cli {

RoundOutcome await_round_outcome(Store& store, const Round& round, int signal_fd,
                                 const std::function<std::optional<std::string>()>& watch) {
  store.add(node_keys::emptied(round.number), 1);
  for (;;) {
    throw_if_interrupted(signal_fd, "the other nodes' ranks to finish the job");
    // The watch first: it marks silent nodes lost (counted below), and
    // catches the store's errors with the reason this node stops.
    if (auto why = watch()) return {RoundOutcome::Kind::kStopped, *why};
    try {
      const std::int64_t finished = store.add(node_keys::done(round.number), 0);
      const std::int64_t accounted =
          finished + lost_node_count(store, round.number) + store.add(node_keys::emptied(round.number), 0);
      // An emptied node counts itself done only once it saw a finished one
      // (kFinished): the count never reaches the nodes before one finished.
      if (accounted >= round.nnodes)
        return {finished > 0 ? RoundOutcome::Kind::kFinished : RoundOutcome::Kind::kNoRankLeft, ""};
    } catch (const Error&) {
      // The store failed between the watch's look and this one: the next
      // look at the watch says why.
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace lockstep::cli

// Sends from a root to some ranks alone: see receivers.h.
#include "receivers.h"

#include <algorithm>
#include <utility>

#include "common/enforce.h"
#include "written_across.h"

namespace lockstep::torch {

Receivers::Receivers(const ProcessGroup& group, int root, std::vector<int> ranks, std::string_view caller)
    : root_(root), ranks_(std::move(ranks)) {
  for (int r : ranks_)
    LOCKSTEP_CHECK_ARG(r >= 0 && r < group.size() && r != root, "{}: receiver {} of a group of {} with root {}", caller,
                       r, group.size(), root);
}

bool Receivers::receiving(const ProcessGroup& group) const {
  return std::find(ranks_.begin(), ranks_.end(), group.rank()) != ranks_.end();
}

void Receivers::issue(ProcessGroup& group, Buffer b, int tag, std::vector<std::shared_ptr<Work>>& transfers) const {
  const bool across = goes_written_across(b);
  if (receiving(group)) {
    if (across)
      receive_written_across(group, b, root_, tag, transfers);
    else
      transfers.push_back(group.recv(b, root_, tag));
    return;
  }
  if (sending(group))
    for (int r : ranks_) {
      if (across)
        write_across(group, b, r, tag, transfers);
      else
        transfers.push_back(group.send(b, r, tag));
    }
}

}  // namespace lockstep::torch

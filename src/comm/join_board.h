// Where a replacement and the group it joins meet (ProcessGroup::grow,
// init_process_group for LOCKSTEP_INCARNATION > 0): keys of the job's root
// store under the world group's "<key>/join/", which every group the job
// re-forms keeps (GroupSpec::join_board). The replacement says it waits;
// the group's rank 0 sees it at a step boundary and admits it by naming
// the group to form. Pure; thread-safe.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace lockstep::join_board {

// Incremented by each replacement once it asked: a group reads this one
// counter until it changes.
inline std::string asks(const std::string& board) { return board + "asks"; }
// World rank `rank`'s replacement waits; the value is its incarnation.
inline std::string ask(const std::string& board, int rank) { return fmt::format("{}ask/{}", board, rank); }
// Incarnation `incarnation` of world rank `rank` is admitted: the value is
// the group to form (admission_text).
inline std::string admit(const std::string& board, int rank, int incarnation) {
  return fmt::format("{}admit/{}.{}", board, rank, incarnation);
}
// Its admission failed (it did not come): not admitted again.
inline std::string failed(const std::string& board, int rank, int incarnation) {
  return fmt::format("{}failed/{}.{}", board, rank, incarnation);
}
// The job's work is done: no replacement joins any more.
inline std::string closed(const std::string& board) { return board + "closed"; }

// A member of a group to form: its world rank and incarnation.
struct Member {
  int rank = 0;
  int incarnation = 0;
};

// "<group key>\n<rank>.<incarnation> ..." and back.
inline std::string admission_text(const std::string& key, const std::vector<Member>& members) {
  std::string text = key + "\n";
  for (const Member& m : members) text += fmt::format("{}.{} ", m.rank, m.incarnation);
  return text;
}

inline std::vector<Member> members_of(const std::string& text, std::string* key) {
  const auto newline = text.find('\n');
  *key = text.substr(0, newline);
  std::vector<Member> out;
  std::istringstream in(newline == std::string::npos ? std::string() : text.substr(newline + 1));
  Member m;
  char dot = 0;
  while (in >> m.rank >> dot >> m.incarnation) out.push_back(m);
  return out;
}

}  // namespace lockstep::join_board

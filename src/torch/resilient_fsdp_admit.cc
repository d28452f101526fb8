// ShardedResilientTrainer's replacements (lockstep/torch/resilient_fsdp.h,
// docs/fsdp.md "Replacements"): the survivors grow the group back to the
// whole job after a committed step, feed each replacement its shard from
// the copy they held it in, compare both ends, and re-form the ring of
// copies over the whole job; a replacement's constructor is fed.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_options.h"
#include "optimizer_state.h"
#include "resilient_fsdp_state.h"
#include "state_digest.h"
#include "survival.h"

namespace lockstep::torch {

using ::torch::Tensor;
using detail::ShardCopy;
using sharded_resilience::every_shard_home;
using sharded_resilience::world_ranks_named;

namespace {

// Tags of a replacement's feeding: the optimizer's options, its shard's
// blocks (one per unit, from the first), then its optimizer state's table
// and tensors.
constexpr int kFeedFirstUnitTag = 0x5e01;
constexpr int kFeedStateTableTag = 0x5f00;
constexpr int kFeedStateTensorTag = 0x5f01;
constexpr int kFeedOptionsTag = 0x5f02;

// What a replacement's shard is compared by, on both ends: one number
// over the optimizer's options (the user's, as options_bytes has them),
// the shard's pieces, then their state as `table` holds it (the entries,
// then each tensor). Taken once the transfers are over, on holder and
// replacement at once (taken while the sends went, it was no faster on
// two cores: it takes a core from their copies).
std::uint64_t shard_digest(const std::string& options, const std::vector<Tensor>& pieces, const StateTable& table) {
  std::uint64_t digest = digest_of(options.data(), options.size(), kDigestStart);
  digest = digest_of(pieces, digest);
  digest = digest_of(table.entries.data(), table.entries.size() * sizeof(std::int64_t), digest);
  return digest_of(table.tensors, digest);
}

// The holder's side of feeding `shard` to its replacement: every unit's
// block of its copy, the optimizer state's table, then the tensors it
// names, all issued at once (a group runs them in order). Returns the
// shard's digest.
std::uint64_t send_shard(ProcessGroup& grown, int shard, ShardCopy& copy, const std::string& options) {
  std::vector<std::shared_ptr<Work>> works;
  for (std::size_t u = 0; u < copy.unit_count(); ++u)
    if (copy.holds(u))
      works.push_back(grown.send(buffer_of(copy.block(u), "a shard's block"), shard,
                                 kFeedFirstUnitTag + static_cast<int>(u)));
  const std::vector<Tensor> pieces = params_of(copy.optimizer());
  const StateTable table = state_table(copy.optimizer(), pieces);
  if (!table.entries.empty())
    works.push_back(grown.send(ConstBuffer{table.entries.data(), table.entries.size(), DType::i64}, shard,
                               kFeedStateTableTag));
  for (const Tensor& t : table.tensors)
    works.push_back(grown.send(buffer_of(t, "a piece's optimizer state"), shard, kFeedStateTensorTag));
  wait_all(works);
  return shard_digest(options, pieces, table);
}

// The replacement's side: its units' shards and the table, then the state
// tensors the table names, into `optimizer`'s state of `pieces` (its own
// shard's parameters, in the holder's table's order). Returns the digest
// of what it then holds, its optimizer's state read anew.
std::uint64_t receive_shard(ProcessGroup& grown, int from, const std::vector<detail::FsdpUnit*>& units,
                            const detail::OwnShard& own, ::torch::optim::Optimizer& optimizer,
                            const std::vector<Tensor>& pieces, const std::string& options) {
  std::vector<std::shared_ptr<Work>> works;
  for (std::size_t u = 0; u < units.size(); ++u)
    if (own.holds(u))
      works.push_back(grown.recv(buffer_of(units[u]->shard(), "the unit's shard"), from,
                                 kFeedFirstUnitTag + static_cast<int>(u)));
  std::vector<std::int64_t> entries(2 * pieces.size(), StateTable::kNoState);
  if (!entries.empty())
    works.push_back(grown.recv(Buffer{entries.data(), entries.size(), DType::i64}, from, kFeedStateTableTag));
  wait_all(works);
  works.clear();
  for (const Tensor& t : states_from_table(optimizer, pieces, entries))
    works.push_back(grown.recv(buffer_of(t, "the copy of a piece's optimizer state"), from, kFeedStateTensorTag));
  wait_all(works);
  return shard_digest(options, pieces, state_table(optimizer, pieces));
}

}  // namespace

// Rank 0's look (survival::ReplacementLook) for a replacement of every
// lost rank: the units' layout is the whole job's, one shard per rank, so
// the group grows back only to the whole job.
std::int64_t ShardedResilientTrainer::State::whole_job_waiting() {
  const auto waiting = replacement_look.waiting(group());
  return waiting && !waiting->empty() && group().size() + static_cast<int>(waiting->size()) == shard_count ? 1 : 0;
}

// After a committed step that saw a replacement waiting for every lost
// rank: the group grows back to the whole job (ProcessGroup::grow), each
// replacement is fed its shard from the rank holding it (feed), and once
// every survivor says so on the group they train on, every shard is home
// again and the backup ring spans the whole job. Until then nothing of
// this trainer changes: a replacement lost while fed leaves the survivors
// as they were (its launcher may start another), and a survivor lost
// meanwhile is recovered from as in a step. The world ranks that joined
// go into `outcome.joined`.
void ShardedResilientTrainer::State::admit(StepOutcome& outcome) {
  admit_pending = false;
  observe("admit");
  ProcessGroup& now = group();
  const std::vector<int> waiting = now.rank() == 0 ? now.replacements_waiting() : std::vector<int>{};
  std::shared_ptr<ProcessGroup> grown;
  try {
    grown = now.grow(waiting, options.window);
  } catch (const Error&) {
    // Not formed here (grow says why in the log of the rank that knows):
    // decided below, with the others.
  }
  const auto recover_here = [&](const std::exception_ptr& failure) { recover_during_admission(failure, outcome); };
  std::int64_t formed = grown && grown->size() == shard_count ? 1 : 0;
  if (!survival::survived([&] { now.allreduce(Buffer{&formed, 1, DType::i64}, ReduceOp::min)->wait(); },
                          recover_here))
    return;
  if (formed == 0) {
    // A replacement of a group grown short of the whole job ends (join
    // says why); a later one is admitted at a later commit point.
    if (grown) superseded.push_back(std::move(grown));
    return;
  }
  Feeding fed;
  std::int64_t all_fed = 0;
  // A loss here is the agreement's to tell: the survivors' answer.
  if (survival::survived([&] { fed = feed(*grown); }, [](const std::exception_ptr&) {})) all_fed = 1;
  const auto agreed = [&] { now.allreduce(Buffer{&all_fed, 1, DType::i64}, ReduceOp::min)->wait(); };
  if (!survival::survived(agreed, [&](const std::exception_ptr& failure) {
        superseded.push_back(std::move(grown));
        recover_here(failure);
      }))
    return;
  // The replacements hear the survivors' answer from the first of them.
  std::int64_t go = all_fed;
  try {
    const int first_survivor = now.world_ranks().front();  // its rank in the whole job's group
    grown->broadcast(Buffer{&go, 1, DType::i64}, first_survivor)->wait();
  } catch (const Error&) {
    // A replacement lost just now: with every survivor fed it, its shard
    // has a copy in the new ring, and the next step takes it over.
  }
  if (all_fed == 0) {
    superseded.push_back(std::move(grown));
    return;
  }
  superseded.push_back(std::move(reformed));
  reformed = std::move(grown);
  holder = every_shard_home(shard_count);
  held.clear();
  taken.clear();
  ring = std::move(fed.ring);
  for (int shard : fed.returning) outcome.joined.push_back(shard);
  observe("admitted");
}

// A loss while replacements were admitted: recovered from as in a step
// (the step has committed: nothing is redone).
void ShardedResilientTrainer::State::recover_during_admission(const std::exception_ptr& failure,
                                                              StepOutcome& outcome) {
  const auto seen = std::chrono::steady_clock::now();
  const std::vector<int> gone = recover(failure);
  outcome.recovery_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count();
  outcome.lost.insert(outcome.lost.end(), gone.begin(), gone.end());
}

// On the group grown back to the whole job (its rank r is world rank r and
// shard r), every member: the step count, who holds each shard and the
// options' length, from the first member that has them; from it, the
// optimizer's options (a scheduler's learning rate) to the replacements;
// each replacement's shard (every unit's block and its optimizer state)
// from the survivor holding it, by sends to it alone, in shard order,
// all issued at once; then every member compares a digest
// of each shard that moved on both ends, and the backup ring is re-formed
// over the whole group with every shard home. Changes nothing of this
// trainer but a replacement's parameters, optimizer and step count.
ShardedResilientTrainer::State::Feeding ShardedResilientTrainer::State::feed(ProcessGroup& grown) {
  const bool receiving = !has_state;
  const auto size = static_cast<std::size_t>(grown.size());
  std::vector<std::int64_t> committed_of(size);
  const std::int64_t mine = has_state ? static_cast<std::int64_t>(committed) : -1;
  grown.allgather(ConstBuffer{&mine, 1, DType::i64}, Buffer{committed_of.data(), size, DType::i64})->wait();
  Feeding fed;
  const auto first = std::find_if(committed_of.begin(), committed_of.end(), [](std::int64_t c) { return c >= 0; });
  if (first == committed_of.end())
    throw Error("ShardedResilientTrainer: no member of the grown group holds the training state; restart from the "
                "last checkpoint (lockstep run --max-restarts)");
  fed.source = static_cast<int>(first - committed_of.begin());
  for (std::size_t r = 0; r < size; ++r) {
    if (committed_of[r] < 0) fed.returning.push_back(static_cast<int>(r));
    else if (committed_of[r] != *first)
      throw Error(fmt::format("ShardedResilientTrainer: the survivors are {} steps apart when a replacement joins; "
                              "the commit rule was broken",
                              committed_of[r] - *first));
  }
  // Who holds each shard, then the length of the optimizer's options.
  std::vector<std::int64_t> plan(static_cast<std::size_t>(shard_count) + 1);
  std::string options;
  if (has_state) {
    for (int shard = 0; shard < shard_count; ++shard)
      plan[static_cast<std::size_t>(shard)] =
          group().world_ranks()[static_cast<std::size_t>(holder[static_cast<std::size_t>(shard)])];
    options = options_bytes(*optimizer);
    plan.back() = static_cast<std::int64_t>(options.size());
  }
  grown.broadcast(Buffer{plan.data(), plan.size(), DType::i64}, fed.source)->wait();
  const std::vector<std::int64_t> held_by(plan.begin(), plan.end() - 1);
  if (receiving) committed = static_cast<std::uint64_t>(*first);
  observe("feed");
  // The options (a scheduler's learning rate) from the first member: what
  // the optimizer state leaves out. A few hundred bytes, which a send
  // leaves in the transport without waiting for the receiver.
  if (grown.rank() == fed.source) {
    std::vector<std::shared_ptr<Work>> options_sent;
    for (int r : fed.returning)
      options_sent.push_back(grown.send(ConstBuffer{options.data(), options.size(), DType::u8}, r, kFeedOptionsTag));
    wait_all(options_sent);
  }
  if (receiving) {
    options.resize(static_cast<std::size_t>(plan.back()));
    grown.recv(Buffer{options.data(), options.size(), DType::u8}, fed.source, kFeedOptionsTag)->wait();
    load_options(*optimizer, options);
  }

  std::vector<detail::FsdpUnit*> units = root().units_within();
  const int me = grown.rank();
  if (!own) own = std::make_unique<detail::OwnShard>(units, whole->rank());
  const std::vector<Tensor> own_params = detail::params_in_shard(units, *optimizer, whole->rank()).params;
  std::vector<std::int64_t> digests(static_cast<std::size_t>(shard_count), 0);
  // What this member's optimizer holds now: a replacement's, as loaded.
  const std::string options_now = options_bytes(*optimizer);
  for (int shard : fed.returning) {
    const int from = static_cast<int>(held_by[static_cast<std::size_t>(shard)]);
    if (me == from)
      digests[static_cast<std::size_t>(shard)] =
          static_cast<std::int64_t>(send_shard(grown, shard, *held.at(shard), options_now));
    else if (me == shard)
      digests[static_cast<std::size_t>(shard)] =
          static_cast<std::int64_t>(receive_shard(grown, from, units, *own, *optimizer, own_params, options_now));
  }
  has_state = true;
  // Each shard that moved, as its holder sent it and as its replacement holds it.
  std::vector<std::int64_t> all(size * digests.size());
  grown.allgather(ConstBuffer{digests.data(), digests.size(), DType::i64},
                  Buffer{all.data(), all.size(), DType::i64})
      ->wait();
  std::vector<int> differ;
  for (int shard : fed.returning) {
    const auto at = [&](std::int64_t rank) {
      return all[static_cast<std::size_t>(rank) * digests.size() + static_cast<std::size_t>(shard)];
    };
    if (at(held_by[static_cast<std::size_t>(shard)]) != at(shard)) differ.push_back(shard);
  }
  if (!differ.empty())
    throw Error(fmt::format("ShardedResilientTrainer: after their shards were sent, {} hold other bytes (parameters "
                            "or optimizer state) than the survivors that held them; a shard that differs would train "
                            "apart silently, so the job stops here",
                            world_ranks_named(differ)));
  observe("fed");
  const std::map<int, ShardCopy*> none_held;
  fed.ring = std::make_unique<detail::SurvivorBackup>(grown, every_shard_home(shard_count), units, *optimizer,
                                                      whole->rank(), *own, own_params, none_held);
  return fed;
}

// A replacement (the launcher started it for a lost rank; its
// init_process_group joined the running group, grown back to the whole
// job, and fully_shard and ShardBackup built its units alone): fed by its
// peers, it holds its shard and runs held steps on that group as they do.
void ShardedResilientTrainer::State::join() {
  if (whole->size() != whole->job_size())
    throw Error(fmt::format("ShardedResilientTrainer: this replacement joined a group of {} ranks, but a fully sharded "
                            "model's layout is the whole job's ({} ranks); the survivors admit replacements only "
                            "for every lost rank at once, and the launcher starts another",
                            whole->size(), whole->job_size()));
  has_state = false;
  reformed = root().group_ptr();
  Feeding fed = feed(*reformed);
  std::int64_t go = 0;
  reformed->broadcast(Buffer{&go, 1, DType::i64}, fed.source)->wait();
  if (go == 0)
    throw Error("ShardedResilientTrainer: the survivors could not all feed this replacement (one was lost, or a "
                "replacement was); it ends, and its launcher starts another where --max-replacements allows");
  ring = std::move(fed.ring);
  observe("joined");
}

}  // namespace lockstep::torch

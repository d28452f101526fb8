// The token that guards a store several hosts reach. The launcher of one
// node uses a random token, handed to its ranks. Several nodes (or ranks
// started by another launcher, rank 0 hosting the store) must agree without
// talking first, so the token comes from what every one of them is given: LOCKSTEP_STORE_TOKEN if the user set
// it (a real secret), else a value derived from the rendezvous id (or, with
// none, from the store's endpoint and the job's size). A derived token keeps out
// strays and other jobs, not someone who knows the id. Pure; thread-safe.
#pragma once

#include <optional>
#include <string>

namespace lockstep {

// `user_token`: LOCKSTEP_STORE_TOKEN, if set. `shared_facts`: what every node
// of the job was given (the rendezvous id, or the endpoint and job size).
std::string shared_store_token(const std::optional<std::string>& user_token, const std::string& shared_facts);

}  // namespace lockstep

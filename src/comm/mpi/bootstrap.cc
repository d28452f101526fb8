// The rendezvous store under mpirun without MASTER_ADDR; see bootstrap.h.
//
// Protocol, one MPI_Ibcast from rank 0 of a fixed-size message:
//   "ok\n<host>\n<port>\n<token>"  the store is up; connect there
//   "error\n<text>"                rank 0 could not start it; every rank
//                                  fails with rank 0's reason
// The host is 127.0.0.1 when every rank runs on rank 0's host (then the
// server listens on loopback only), else rank 0's host name, which the
// others resolve. Set MASTER_ADDR and MASTER_PORT where host names do not
// resolve across hosts; the bootstrap is then not used.
#include "comm/mpi/bootstrap.h"

#include <array>
#include <iterator>
#include <sstream>

#include <fmt/format.h>

#include "comm/mpi/runtime.h"
#include "common/host.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr std::size_t kMessageBytes = 1024;
using Message = std::array<char, kMessageBytes>;

// Rank 0: starts the server and says where it is, or why it is not.
std::string host_store(const LaunchInfo& launch, TcpStoreOptions& options, BootstrappedStore& out) {
  try {
    if (options.token.empty()) options.token = random_hex(16);
    const bool one_host = launch.local_world_size == launch.world_size;
    const std::uint16_t port = launch.master_port > 0 ? static_cast<std::uint16_t>(launch.master_port) : 0;
    out.server = std::make_unique<TcpStoreServer>(one_host ? "127.0.0.1" : "", port, options);
    return fmt::format("ok\n{}\n{}\n{}", one_host ? "127.0.0.1" : host_name(), out.server->port(), options.token);
  } catch (const std::exception& e) {
    return fmt::format("error\n{}", e.what());
  }
}

// Every rank: rank 0's message, within the connect timeout.
void share(Message& message, const LaunchInfo& launch) {
  // A heap copy for MPI: if the wait times out, MPI may still write into it
  // later, so it is then left allocated.
  auto* buffer = new Message(message);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibcast(buffer->data(), static_cast<int>(buffer->size()), MPI_CHAR, 0, MPI_COMM_WORLD, &request);
  const mpi::WaitOutcome outcome =
      mpi::test_until(request, Deadline::after(launch.connect_timeout), std::chrono::microseconds(100), false);
  if (!outcome.done)
    throw TimeoutError(fmt::format("rank {}/{}: rank 0 did not share the rendezvous store's address within "
                                   "LOCKSTEP_CONNECT_TIMEOUT ({:.0f} s){}; did every rank call init_process_group?",
                                   launch.rank, launch.world_size,
                                   static_cast<double>(launch.connect_timeout.count()) / 1000.0,
                                   outcome.error == MPI_SUCCESS ? "" : ": " + mpi::error_text(outcome.error)),
                       0);
  message = *buffer;
  delete buffer;
}

}  // namespace

BootstrappedStore bootstrap_store_with_mpi(const LaunchInfo& launch, TcpStoreOptions options) {
  const std::string who = fmt::format("rank {}/{}", launch.rank, launch.world_size);
  const mpi::WorldPlace world = mpi::ensure_initialized(who, launch.mpi_abort_on_failure);
  if (world.rank != launch.rank || world.size != launch.world_size)
    throw ConfigError(fmt::format("{}: mpirun's variables say rank {} of {}, but MPI says rank {} of {}; was the "
                                  "program started by another mpirun than the one that set OMPI_COMM_WORLD_*?",
                                  who, launch.rank, launch.world_size, world.rank, world.size));
  BootstrappedStore out;
  Message message{};
  if (world.rank == 0) {
    const std::string text = host_store(launch, options, out);
    if (text.size() >= kMessageBytes)
      throw ConfigError(fmt::format("{}: the store's address does not fit the bootstrap message: {}", who, text));
    text.copy(message.data(), text.size());
  }
  share(message, launch);

  std::istringstream in(std::string(message.data()));
  std::string status, host, port, token;
  std::getline(in, status);
  if (status != "ok") {
    std::string reason((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    throw ConfigError(fmt::format("{}: rank 0 could not host the rendezvous store: {}. Set MASTER_ADDR and "
                                  "MASTER_PORT to choose where it runs",
                                  who, reason));
  }
  std::getline(in, host);
  std::getline(in, port);
  std::getline(in, token);
  options.token = token;
  try {
    out.client = std::make_shared<TcpStore>(host, static_cast<std::uint16_t>(std::stoi(port)), options);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: cannot reach the rendezvous store rank 0 hosts at {}:{}: {}. If host names "
                                  "do not resolve between the hosts, set MASTER_ADDR (rank 0's address) and "
                                  "MASTER_PORT",
                                  who, host, port, e.what()));
  }
  return out;
}

}  // namespace lockstep

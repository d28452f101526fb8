// Full-mesh connection setup and goodbye; see mesh.h.
#include "comm/tcp/mesh.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include <fmt/format.h>

#include "comm/tcp/transfer.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr std::uint32_t kHelloMagic = 0x4c4b5043;  // "LKPC"

struct Hello {
  std::uint32_t magic;
  std::uint32_t size;
  std::uint32_t rank;
  std::uint32_t reserved;
  std::uint64_t group_hash;
};

// FNV-1a: a stable 64-bit digest of the group key, compared on connect.
std::uint64_t hash_key(const std::string& key) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::pair<std::string, std::uint16_t> split_endpoint(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos) throw Error(fmt::format("malformed peer address '{}'", endpoint));
  std::string host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return {host, static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1)))};
}

std::string address_key(int rank) { return fmt::format("tcp/addr/{}", rank); }

}  // namespace

Mesh::Mesh(const BackendContext& ctx)
    : rank_(ctx.rank),
      size_(ctx.size),
      log_(ctx.log),
      os_(*ctx.os),
      peers_(static_cast<std::size_t>(ctx.size)),
      departed_(static_cast<std::size_t>(ctx.size), false) {
  if (size_ == 1) return;
  Socket listener = listen_tcp(ctx.listen_address, 0);
  const std::uint16_t port = local_port(listener.fd());
  ctx.store->set(address_key(rank_), format_endpoint(ctx.listen_address, port));
  log_.debug("tcp: listening on {}", format_endpoint(ctx.listen_address, port));

  const Deadline deadline = Deadline::starting_at(os_.now(), ctx.connect_timeout);
  connect_lower(ctx, deadline);
  accept_higher(ctx, listener, deadline);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    set_nonblocking(fd(p));
    set_nodelay(fd(p));
    set_keepalive(fd(p));
  }
  log_.debug("tcp: connected to {} peers", size_ - 1);
}

std::string Mesh::self() const { return fmt::format("rank {}/{}", rank_, size_); }

void Mesh::connect_lower(const BackendContext& ctx, Deadline deadline) {
  const std::uint64_t group_hash = hash_key(ctx.group_key);
  for (int peer = 0; peer < rank_; ++peer) {
    const std::string endpoint = ctx.store->get(address_key(peer));
    const auto [host, port] = split_endpoint(endpoint);
    Socket s = connect_tcp(host, port, deadline, os_);
    set_nonblocking(s.fd());
    const Hello hello{kHelloMagic, static_cast<std::uint32_t>(size_), static_cast<std::uint32_t>(rank_), 0, group_hash};
    Hello ack{};
    IoResult r = send_all(s.fd(), &hello, sizeof hello, deadline, os_);
    if (r.status == IoStatus::ok) r = recv_all(s.fd(), &ack, sizeof ack, deadline, os_);
    if (r.status != IoStatus::ok)
      throw PeerError(fmt::format("{}: connecting to rank {} at {} failed during the handshake: {}", self(), peer,
                                  endpoint, r.describe()),
                      peer);
    if (ack.magic != kHelloMagic || ack.rank != static_cast<std::uint32_t>(peer))
      throw ConfigError(fmt::format("{}: the process at {} is not rank {} of this group (it answered as rank {}); "
                                    "two jobs may share a store: give each job its own MASTER_PORT or run id",
                                    self(), endpoint, peer, ack.rank));
    peers_[static_cast<std::size_t>(peer)] = std::move(s);
  }
}

void Mesh::accept_higher(const BackendContext& ctx, const Socket& listener, Deadline deadline) {
  const std::uint64_t group_hash = hash_key(ctx.group_key);
  int expected = size_ - 1 - rank_;
  while (expected > 0) {
    Socket s = accept_tcp(listener, deadline, os_);
    if (!s.valid()) {
      std::string missing;
      for (int p = rank_ + 1; p < size_; ++p)
        if (!peers_[static_cast<std::size_t>(p)].valid()) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", p);
      throw TimeoutError(fmt::format("{}: rank(s) {} did not connect within the connect timeout; are they running "
                                     "and can they reach this host's address {}?",
                                     self(), missing, ctx.listen_address));
    }
    set_nonblocking(s.fd());
    Hello hello{};
    if (recv_all(s.fd(), &hello, sizeof hello, deadline, os_).status != IoStatus::ok) continue;  // a stray connection
    const int peer = static_cast<int>(hello.rank);
    if (hello.magic != kHelloMagic || hello.group_hash != group_hash) {
      log_.warn("tcp: refused a connection from {} that belongs to another job or group", peer_host(s.fd()));
      continue;
    }
    if (hello.size != static_cast<std::uint32_t>(size_))
      throw ConfigError(fmt::format("{}: rank {} believes the world size is {}, this rank {}; every rank must get the "
                                    "same WORLD_SIZE",
                                    self(), peer, hello.size, size_));
    if (peer <= rank_ || peer >= size_ || peers_[static_cast<std::size_t>(peer)].valid())
      throw ConfigError(fmt::format("{}: a second process claims to be rank {}; every rank needs a distinct RANK",
                                    self(), peer));
    const Hello ack{kHelloMagic, static_cast<std::uint32_t>(size_), static_cast<std::uint32_t>(rank_), 0, group_hash};
    if (send_all(s.fd(), &ack, sizeof ack, deadline, os_).status != IoStatus::ok) continue;
    peers_[static_cast<std::size_t>(peer)] = std::move(s);
    --expected;
  }
}

void Mesh::goodbye(Deadline deadline) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !peers_[static_cast<std::size_t>(p)].valid()) continue;
    const unsigned char bye = kGoodbyeByte;
    (void)send_all(fd(p), &bye, 1, deadline, os_);
  }
  // Wait for every peer's goodbye (or its hang-up), so no peer still inside
  // an operation sees this rank vanish. After a clean run the goodbye is the
  // next byte on every connection; anything else means the peer is still
  // mid-operation (a mismatched program or an aborted group), and there is
  // nothing to wait for.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !peers_[static_cast<std::size_t>(p)].valid()) continue;
    unsigned char byte = 0;
    if (!expired(os_, deadline)) (void)recv_all(fd(p), &byte, 1, deadline, os_);
    ::shutdown(fd(p), SHUT_RDWR);
  }
  for (auto& s : peers_) s.close();
}

void Mesh::transfer(const OpContext& op, std::span<const Channel> channels) { run_transfer(*this, op, channels); }

}  // namespace lockstep

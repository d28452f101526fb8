// Delays packets by DELAY ± JITTER milliseconds and reorders some, so a
// test can give an emulated host's link the latency, jitter and reordering
// of a real network where the kernel lacks netem (tc qdisc netem). The
// kernel hands the packets an iptables NFQUEUE rule selects to this
// process (nfnetlink queue, libnetfilter_queue); it accepts each once its
// delay has passed:
//   - each packet's delay is drawn uniformly from [DELAY - JITTER,
//     DELAY + JITTER], but it never leaves before a packet that arrived
//     before it, as on a link's queue (netem's jitter reorders nearly every
//     other packet of a stream, which no real path does and which TCP
//     answers by collapsing its window);
//   - REORDER percent of the packets go at once, ahead of those held (as
//     netem's `reorder`): they overtake.
//
// Usage (in the host's network namespace, as root):
//   iptables -A OUTPUT -o IFACE -j NFQUEUE --queue-num 0 --queue-bypass
//   net_delay --queue 0 --delay-ms 50 [--jitter-ms 20] [--reorder-percent 25] [--seed N] [--report FILE]
// Runs until SIGTERM/SIGINT; then accepts what it still holds, so nothing
// is lost when the test heals the link, and with --report writes how many
// packets it delayed and the largest overtaking it saw.
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int queue = 0;
  double delay_ms = 50;
  double jitter_ms = 0;
  double reorder_percent = 0;
  unsigned seed = 1;
  std::string report;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "net_delay: %s\nusage: net_delay --queue N --delay-ms D [--jitter-ms J] [--seed S] [--report FILE]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(("no value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--queue") o.queue = std::atoi(value);
    else if (arg == "--delay-ms") o.delay_ms = std::atof(value);
    else if (arg == "--jitter-ms") o.jitter_ms = std::atof(value);
    else if (arg == "--reorder-percent") o.reorder_percent = std::atof(value);
    else if (arg == "--seed") o.seed = static_cast<unsigned>(std::atol(value));
    else if (arg == "--report") o.report = value;
    else usage(("unknown option " + arg).c_str());
  }
  if (o.delay_ms < 0 || o.jitter_ms < 0 || o.jitter_ms > o.delay_ms)
    usage("the delay and jitter must be >= 0, the jitter at most the delay");
  if (o.reorder_percent < 0 || o.reorder_percent > 100) usage("the reorder share is a percentage, 0 to 100");
  return o;
}

struct Held {
  Clock::time_point due;
  std::uint32_t id;        // the kernel's packet id
  std::uint64_t arrival;   // order of arrival, for counting overtakes
  // Equal times leave in arrival order.
  bool operator>(const Held& other) const { return due != other.due ? due > other.due : arrival > other.arrival; }
};

// What the callback fills and the loop drains; one per process.
struct Delayer {
  Options options;
  std::mt19937 random;
  std::uniform_real_distribution<double> spread;
  std::uniform_real_distribution<double> percent{0, 100};
  Clock::time_point last_due{};  // of the packets held in order
  std::priority_queue<Held, std::vector<Held>, std::greater<>> held;
  std::uint64_t arrivals = 0;
  std::uint64_t released = 0;
  std::uint64_t overtaken = 0;      // packets released after a later arrival
  std::uint64_t last_released = 0;  // arrival number of the last released packet
  nfq_q_handle* queue = nullptr;

  explicit Delayer(const Options& o)
      : options(o), random(o.seed), spread(o.delay_ms - o.jitter_ms, o.delay_ms + o.jitter_ms) {}

  void hold(std::uint32_t id) {
    const auto now = Clock::now();
    if (options.reorder_percent > 0 && percent(random) < options.reorder_percent) {
      held.push({now, id, arrivals++});  // overtakes everything held
      return;
    }
    const auto delay = std::chrono::duration<double, std::milli>(spread(random));
    last_due = std::max(last_due, now + std::chrono::duration_cast<Clock::duration>(delay));
    held.push({last_due, id, arrivals++});
  }

  // Accepts every packet whose delay has ended (all of them with `all`).
  void release_due(bool all) {
    const auto now = Clock::now();
    while (!held.empty() && (all || held.top().due <= now)) {
      const Held h = held.top();
      held.pop();
      if (released > 0 && h.arrival < last_released) ++overtaken;
      last_released = h.arrival;
      ++released;
      nfq_set_verdict(queue, h.id, NF_ACCEPT, 0, nullptr);
    }
  }

  int ms_to_next() const {
    if (held.empty()) return 100;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(held.top().due - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(left);
  }
};

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* packet, void* data) {
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(packet);
  if (header != nullptr) static_cast<Delayer*>(data)->hold(ntohl(header->packet_id));
  return 0;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "net_delay: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  Delayer delayer(options);

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, nullptr);
  const int signals = signalfd(-1, &stop, SFD_CLOEXEC);
  if (signals < 0) fail("signalfd");

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) fail("nfq_open (needs root and nfnetlink_queue)");
  nfq_unbind_pf(handle, AF_INET);  // older kernels want a fresh binding
  if (nfq_bind_pf(handle, AF_INET) < 0) fail("nfq_bind_pf");
  delayer.queue = nfq_create_queue(handle, static_cast<std::uint16_t>(options.queue), on_packet, &delayer);
  if (delayer.queue == nullptr) fail("nfq_create_queue (is another process bound to that queue?)");
  // The packet's metadata is enough for a verdict; room for a link's worth
  // of packets in flight at its delay.
  if (nfq_set_mode(delayer.queue, NFQNL_COPY_META, 0) < 0) fail("nfq_set_mode");
  nfq_set_queue_maxlen(delayer.queue, 1 << 16);
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 64u << 20);
  const int fd = nfq_fd(handle);
  std::printf("net_delay: queue %d, %.1f ms +- %.1f ms, %.1f%% at once\n", options.queue, options.delay_ms,
              options.jitter_ms, options.reorder_percent);
  std::fflush(stdout);

  std::vector<char> buffer(1 << 16);
  for (;;) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {signals, POLLIN, 0}};
    if (poll(fds, 2, delayer.ms_to_next()) < 0 && errno != EINTR) fail("poll");
    if (fds[1].revents & POLLIN) break;
    if (fds[0].revents & POLLIN) {
      // Everything queued now, so that a burst is held with one timestamp each.
      for (;;) {
        const ssize_t n = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == ENOBUFS) continue;  // the kernel dropped some: as a full link would
          fail("recv");
        }
        nfq_handle_packet(handle, buffer.data(), static_cast<int>(n));
      }
    }
    delayer.release_due(false);
  }
  delayer.release_due(true);
  if (!options.report.empty()) {
    if (FILE* f = std::fopen(options.report.c_str(), "w")) {
      std::fprintf(f, "delayed %llu packet(s), %llu released after a packet that arrived later\n",
                   static_cast<unsigned long long>(delayer.released),
                   static_cast<unsigned long long>(delayer.overtaken));
      std::fclose(f);
    }
  }
  nfq_destroy_queue(delayer.queue);
  nfq_close(handle);
  return 0;
}

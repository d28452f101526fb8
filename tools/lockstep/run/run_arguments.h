// The launcher's command line beyond what CLI11 parses: where the program
// starts, and the compound values torchrun users type (--nnodes MIN:MAX,
// --rdzv-endpoint host:port, --rdzv-conf k=v,..., --tee/--redirects).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lockstep::cli {

// `args` is the whole command line; `first` the index just past "run".
// Inserts "--" before the program's name unless there is one already, so
// that the program's own options (`prog --foo`, `prog -np 3`) reach it
// unchanged instead of being read as the launcher's. Only options of `run`
// (and their values) are skipped to find the program.
std::vector<std::string> separate_program(const CLI::App& run, std::vector<std::string> args, std::size_t first);

struct NodeRange {
  int min = 1;
  int max = 1;
  bool written_as_range = false;  // "MIN:MAX", even with MIN == MAX
  // MIN:MAX is the elastic rendezvous, as --help and torchrun say, even
  // when MIN == MAX: nodes are numbered by the rendezvous, not --node-rank.
  bool elastic() const { return min != max || written_as_range; }
};
// "N" or "MIN:MAX"; throws ConfigError.
NodeRange parse_nnodes(const std::string& text);

struct Endpoint {
  std::string host;
  int port = 0;  // 0: not given
};
// "host", "host:port", "[v6]:port"; throws ConfigError.
Endpoint parse_endpoint(const std::string& text);

struct RendezvousConf {
  double join_timeout = -1;         // < 0: not given
  double last_call_timeout = -1;    // < 0: not given
  double keep_alive_interval = -1;  // seconds between heartbeats; < 0: not given
  int keep_alive_max_attempt = -1;  // heartbeats missed before a node is gone; < 0: not given
  // --rdzv-backend etcd only (torchrun's etcd keys, and lockstep's user):
  std::string protocol;  // "http" or "https"; empty: not given
  std::string cacert;    // the CA that signed the members' certificates
  std::string cert;      // this client's certificate and key, when the cluster asks for one
  std::string key;
  std::string username;  // etcd's authentication; the password comes from LOCKSTEP_ETCD_PASSWORD
  bool names_etcd_keys() const {
    return !protocol.empty() || !cacert.empty() || !cert.empty() || !key.empty() || !username.empty();
  }
};
// "join_timeout=600,last_call_timeout=5,keep_alive_interval=5,
// keep_alive_max_attempt=3" (torchrun's --rdzv-conf keys), and for etcd
// "protocol=https,cacert=F,cert=F,key=F,username=U"; the interval is at
// least 0.01 s, the attempts 1 to 1000, the protocol http or https.
RendezvousConf parse_rdzv_conf(const std::string& text);

// torchrun's --tee/--redirects value: 0 none, 1 stdout, 2 stderr, 3 both,
// for every rank, or "local_rank:value,..." per local rank. Returns the
// value for `local_rank` (0 where the map does not name it).
// torchrun's --duplicate-stdout-filters: "a,b" is two filters, ",," a comma
// inside one. Empty text: none.
std::vector<std::string> parse_filters(const std::string& text);

// torchrun's --local-ranks-filter: "0,2" (empty: every local rank). Throws
// ConfigError for anything but non-negative numbers.
std::vector<int> parse_local_ranks(const std::string& text);

// torchrun's --signals-to-handle: "SIGTERM,SIGINT,SIGUSR1" (names with or
// without SIG). Throws ConfigError naming an unknown signal, or one the
// launcher cannot handle (SIGKILL, SIGSTOP, SIGCHLD).
std::vector<int> parse_signals(const std::string& text);

// How the program starts, as torchrun's -m, --no-python and --run-path say.
struct EntryPoint {
  bool module = false;     // -m: the program is a Python module
  bool no_python = false;  // --no-python: execute it as it is, even a .py
  bool run_path = false;   // --run-path: a Python file run by runpy.run_path
};
// The command each rank executes for `program` (the launcher's positional
// arguments: the program and its own arguments). Python runs with `-u` (as
// under torchrun, so output is not held in a buffer when a rank dies) from
// `python3` in PATH, the interpreter of an activated virtual environment.
// Where torchrun hands every program to Python, a program that is not a
// .py file runs as itself: lockstep's programs are executables.
// Throws ConfigError for -m with --no-python.
std::vector<std::string> rank_command(const std::vector<std::string>& program, const EntryPoint& how);

enum StreamMask : int { kNoStream = 0, kStdout = 1, kStderr = 2, kBothStreams = 3 };
int stream_mask(const std::string& text, int local_rank, const char* option);

}  // namespace lockstep::cli

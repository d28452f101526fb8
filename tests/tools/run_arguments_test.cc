// The launcher's compound arguments: where the program starts, --nnodes
// MIN:MAX, --rdzv-endpoint, --rdzv-conf, --tee/--redirects values, and the
// token several nodes derive without talking.
#include <gtest/gtest.h>

#include <signal.h>

#include <map>
#include <optional>
#include <string>

#include "lockstep/error.h"
#include "run/run_arguments.h"
#include "run/slurm_defaults.h"
#include "store/store_token.h"

namespace lockstep::cli {
namespace {

Config::Lookup lookup_in(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

// srun --ntasks-per-node=1 on 3 nodes: each launcher learns its node, the
// job's size and the store from Slurm; options given by hand win, one node
// needs nothing, and several launchers on a node are refused by name.
TEST(SlurmDefaults, OneLauncherPerNodeTakesTheJobsShapeFromSlurm) {
  const std::map<std::string, std::string> step = {
      {"SLURM_STEP_NUM_NODES", "3"}, {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_NODEID", "2"},
      {"SLURM_STEP_NODELIST", "cn[004-006]"}, {"SLURM_JOB_ID", "90210"}, {"SLURM_STEP_ID", "1"}};
  std::string note;
  const RunOptions o = with_slurm_defaults(RunOptions{}, lookup_in(step), &note);
  EXPECT_EQ(o.nnodes, "3");
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "cn004");
  EXPECT_EQ(o.master_port, 15210);
  EXPECT_EQ(o.run_id, "slurm-90210.1");
  EXPECT_NE(note.find("node 2 of 3, store on cn004:15210"), std::string::npos) << note;

  RunOptions by_hand;
  by_hand.rdzv_endpoint = "head:29400";
  note.clear();
  const RunOptions kept = with_slurm_defaults(by_hand, lookup_in(step), &note);
  EXPECT_EQ(kept.nnodes, "1");
  EXPECT_TRUE(note.empty());

  auto one_node = step;
  one_node["SLURM_STEP_NUM_NODES"] = "1";
  one_node["SLURM_STEP_NUM_TASKS"] = "1";
  EXPECT_EQ(with_slurm_defaults(RunOptions{}, lookup_in(one_node), &note).nnodes, "1");

  auto crowded = step;
  crowded["SLURM_STEP_NUM_TASKS"] = "6";
  try {
    with_slurm_defaults(RunOptions{}, lookup_in(crowded), &note);
    FAIL() << "two launchers per node were taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("srun --ntasks-per-node=1 lockstep run"), std::string::npos) << e.what();
  }
}

std::vector<std::string> words(std::initializer_list<const char*> list) { return {list.begin(), list.end()}; }

TEST(RunArguments, TheProgramStartsAtTheFirstWordThatIsNotTheLaunchers) {
  CLI::App app;
  auto* run = app.add_subcommand("run");
  std::string value;
  bool flag = false;
  run->add_option("--nproc-per-node", value);
  run->add_flag("--no-prefix", flag);
  const auto separated = [&](std::initializer_list<const char*> args) {
    return separate_program(*run, words(args), 2);
  };
  EXPECT_EQ(separated({"lockstep", "run", "--nproc-per-node", "2", "prog", "--foo", "-np", "3"}),
            words({"lockstep", "run", "--nproc-per-node", "2", "--", "prog", "--foo", "-np", "3"}));
  EXPECT_EQ(separated({"lockstep", "run", "--no-prefix", "--nproc-per-node=2", "prog", "--no-prefix"}),
            words({"lockstep", "run", "--no-prefix", "--nproc-per-node=2", "--", "prog", "--no-prefix"}));
  EXPECT_EQ(separated({"lockstep", "run", "--nproc-per-node", "2", "--", "prog", "--", "x"}),
            words({"lockstep", "run", "--nproc-per-node", "2", "--", "prog", "--", "x"}));
  // An option the launcher does not know stays where it is, for CLI11 to refuse.
  EXPECT_EQ(separated({"lockstep", "run", "--bogus", "prog"}), words({"lockstep", "run", "--bogus", "--", "prog"}));
}

TEST(RunArguments, NodeCountsAreNOrMinMax) {
  EXPECT_EQ(parse_nnodes("3").min, 3);
  EXPECT_FALSE(parse_nnodes("3").elastic());
  const NodeRange r = parse_nnodes("2:4");
  EXPECT_EQ(r.min, 2);
  EXPECT_EQ(r.max, 4);
  EXPECT_TRUE(r.elastic());
  // MIN:MAX is the elastic rendezvous even when MIN == MAX (torchrun's
  // --nnodes 2:2 with an --rdzv-id), unlike a plain N.
  const NodeRange fixed_size = parse_nnodes("2:2");
  EXPECT_EQ(fixed_size.min, 2);
  EXPECT_EQ(fixed_size.max, 2);
  EXPECT_TRUE(fixed_size.elastic());
  for (const char* bad : {"0", "4:2", "a", "1:2:3", "", "2:"}) EXPECT_THROW(parse_nnodes(bad), ConfigError) << bad;
}

TEST(RunArguments, EndpointsAreHostAndOptionalPort) {
  EXPECT_EQ(parse_endpoint("node0:29400").host, "node0");
  EXPECT_EQ(parse_endpoint("node0:29400").port, 29400);
  EXPECT_EQ(parse_endpoint("node0").port, 0);
  EXPECT_EQ(parse_endpoint("[::1]:7").host, "::1");
  EXPECT_EQ(parse_endpoint("[::1]:7").port, 7);
  for (const char* bad : {"", ":80", "h:0", "h:65536", "[::1", "h:x"}) EXPECT_THROW(parse_endpoint(bad), ConfigError) << bad;
}

TEST(RunArguments, RendezvousConfTakesTorchrunsKeys) {
  const RendezvousConf c = parse_rdzv_conf("join_timeout=60,last_call_timeout=2.5");
  EXPECT_EQ(c.join_timeout, 60);
  EXPECT_EQ(c.last_call_timeout, 2.5);
  EXPECT_LT(parse_rdzv_conf("").join_timeout, 0);
  EXPECT_THROW(parse_rdzv_conf("read_timeout=5"), ConfigError);
  EXPECT_THROW(parse_rdzv_conf("join_timeout=-1"), ConfigError);
}

TEST(RunArguments, RendezvousConfTakesTorchrunsKeepAliveKeys) {
  const RendezvousConf c = parse_rdzv_conf("keep_alive_interval=0.5,keep_alive_max_attempt=4,join_timeout=9");
  EXPECT_EQ(c.keep_alive_interval, 0.5);
  EXPECT_EQ(c.keep_alive_max_attempt, 4);
  EXPECT_EQ(c.join_timeout, 9);
  const RendezvousConf none = parse_rdzv_conf("join_timeout=9");
  EXPECT_LT(none.keep_alive_interval, 0);  // torchrun's defaults then apply
  EXPECT_LT(none.keep_alive_max_attempt, 0);
  for (const char* bad : {"keep_alive_interval=0", "keep_alive_interval=-1", "keep_alive_interval=x",
                          "keep_alive_max_attempt=0", "keep_alive_max_attempt=1.5", "keep_alive_max_attempt="})
    EXPECT_THROW(parse_rdzv_conf(bad), ConfigError) << bad;
}

TEST(RunArguments, RendezvousConfTakesEtcdKeys) {
  const RendezvousConf c =
      parse_rdzv_conf("protocol=https,cacert=/etc/ca.pem,cert=/etc/c.pem,key=/etc/c.key,username=job,join_timeout=9");
  EXPECT_EQ(c.protocol, "https");
  EXPECT_EQ(c.cacert, "/etc/ca.pem");
  EXPECT_EQ(c.cert, "/etc/c.pem");
  EXPECT_EQ(c.key, "/etc/c.key");
  EXPECT_EQ(c.username, "job");
  EXPECT_TRUE(c.names_etcd_keys());
  EXPECT_FALSE(parse_rdzv_conf("join_timeout=9").names_etcd_keys());
  for (const char* bad : {"protocol=ftp", "protocol=", "cacert=", "username="})
    EXPECT_THROW(parse_rdzv_conf(bad), ConfigError) << bad;
}

TEST(RunArguments, TeeAndRedirectsValuesApplyToAllOrPerLocalRank) {
  EXPECT_EQ(stream_mask("3", 5, "--tee"), kBothStreams);
  EXPECT_EQ(stream_mask("", 0, "--tee"), kNoStream);
  EXPECT_EQ(stream_mask("0:1,1:2", 0, "--tee"), kStdout);
  EXPECT_EQ(stream_mask("0:1,1:2", 1, "--tee"), kStderr);
  EXPECT_EQ(stream_mask("0:1,1:2", 2, "--tee"), kNoStream);
  for (const char* bad : {"4", "x", "0:4", "0:1,2"}) EXPECT_THROW(stream_mask(bad, 0, "--tee"), ConfigError) << bad;
}

TEST(StoreToken, EveryNodeDerivesTheSameTokenAndAUserTokenWins) {
  const std::string a = shared_store_token(std::nullopt, "id/job-a");
  EXPECT_EQ(a, shared_store_token(std::nullopt, "id/job-a"));
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, shared_store_token(std::nullopt, "id/job-b"));
  EXPECT_EQ(shared_store_token(std::string("s3cret"), "id/job-a"), "s3cret");
  EXPECT_EQ(shared_store_token(std::string(""), "id/job-a"), a);
}

// torchrun's entry points: a .py file and -m and --run-path go to Python
// (unbuffered), --no-python and any other program run as they are.
TEST(RunArguments, EntryPointsBuildTheCommandTorchrunWould) {
  using V = std::vector<std::string>;
  EXPECT_EQ(rank_command({"train.py", "--lr", "1"}, {}), (V{"python3", "-u", "train.py", "--lr", "1"}));
  EXPECT_EQ(rank_command({"pkg.train", "x"}, {.module = true}), (V{"python3", "-u", "-m", "pkg.train", "x"}));
  EXPECT_EQ(rank_command({"./train.py"}, {.no_python = true}), (V{"./train.py"}));
  EXPECT_EQ(rank_command({"./train", "-np", "3"}, {}), (V{"./train", "-np", "3"}));
  const V run_path = rank_command({"/abs/train.py", "a"}, {.run_path = true});
  ASSERT_EQ(run_path.size(), 6u);
  EXPECT_EQ(V(run_path.begin(), run_path.begin() + 3), (V{"python3", "-u", "-c"}));
  EXPECT_NE(run_path[3].find("runpy.run_path(sys.argv[0], run_name='__main__')"), std::string::npos);
  EXPECT_EQ(V(run_path.begin() + 4, run_path.end()), (V{"/abs/train.py", "a"}));
  EXPECT_THROW(rank_command({"pkg"}, {.module = true, .no_python = true}), ConfigError);
  EXPECT_THROW(rank_command({}, {}), ConfigError);
}

TEST(RunArguments, FiltersRanksAndSignalsAreTorchrunsLists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(parse_filters("loss,acc"), (V{"loss", "acc"}));
  EXPECT_EQ(parse_filters("a,,b,c"), (V{"a,b", "c"}));
  EXPECT_TRUE(parse_filters("").empty());
  EXPECT_EQ(parse_local_ranks("0,2"), (std::vector<int>{0, 2}));
  EXPECT_TRUE(parse_local_ranks("").empty());
  EXPECT_THROW(parse_local_ranks("0,x"), ConfigError);
  EXPECT_THROW(parse_local_ranks("-1"), ConfigError);
  EXPECT_EQ(parse_signals("SIGTERM,INT,SIGUSR1"), (std::vector<int>{SIGTERM, SIGINT, SIGUSR1}));
  EXPECT_THROW(parse_signals("SIGTERM,SIGNOPE"), ConfigError);
  EXPECT_THROW(parse_signals("SIGKILL"), ConfigError);
  EXPECT_THROW(parse_signals(""), ConfigError);
}

}  // namespace
}  // namespace lockstep::cli

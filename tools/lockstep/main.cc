// The lockstep command line: one binary, subcommands per task.
//   lockstep run     start a program on several processes (a torchrun equivalent)
//   lockstep bench   measure collectives (nccl-tests' interface)
//   lockstep doctor  explain how a data-parallel program scales
//   lockstep simulate  predict how it scales on a cluster that is not here
//   lockstep --version  what this build has: its version, libtorch, backends
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_command.h"
#include "doctor/doctor_command.h"
#include "lockstep/error.h"
#include "run/run_arguments.h"
#include "run/run_command.h"
#include "simulate/simulate_command.h"
#include "version.h"

int main(int argc, char** argv) {
  // Named, so that every usage line names the program ("Usage: lockstep run
  // ..."): CLI11 takes the name from argv only when it parses argv itself.
  CLI::App app{"lockstep: synchronous data-parallel training in C++", "lockstep"};
  app.require_subcommand(1);
  // Answered before the subcommand is required, and exits 0.
  app.set_version_flag("-V,--version", lockstep::cli::version_text,
                       "Print the version, the libtorch and the backends this lockstep was built with, and exit");
  lockstep::cli::RunOptions run;
  lockstep::cli::BenchOptions bench;
  const CLI::App* run_app = lockstep::cli::add_run_command(app, run);
  lockstep::cli::add_bench_command(app, bench);
  lockstep::cli::DoctorOptions doctor;
  lockstep::cli::add_doctor_command(app, doctor);
  lockstep::cli::SimulateOptions simulate;
  lockstep::cli::add_simulate_command(app, simulate);
  // mpirun and nccl-tests users type "-np N" to bench; CLI11 takes only
  // one-letter short options, so it is spelled --np inside. A program that
  // `run` starts gets its arguments untouched: "--" marks where they begin.
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() > 1 && args[1] == "bench")
    for (auto& a : args)
      if (a == "-np") a = "--np";
  if (args.size() > 1 && args[1] == "run") args = lockstep::cli::separate_program(*run_app, std::move(args), 2);
  std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("run")) return lockstep::cli::run_job(run);
    if (app.got_subcommand("bench")) return lockstep::cli::run_bench(bench, args);
    if (app.got_subcommand("doctor")) return lockstep::cli::run_doctor(doctor);
    if (app.got_subcommand("simulate")) return lockstep::cli::run_simulate(simulate);
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}

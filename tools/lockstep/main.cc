// The lockstep command line: one binary, subcommands per task.
//   lockstep run     start a program on several processes (a torchrun equivalent)
//   lockstep bench   measure collectives (nccl-tests' interface)
//   lockstep doctor  explain how a data-parallel program scales
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_command.h"
#include "doctor/doctor_command.h"
#include "lockstep/error.h"
#include "run/run_command.h"

int main(int argc, char** argv) {
  CLI::App app{"lockstep: synchronous data-parallel training in C++"};
  app.require_subcommand(1);
  lockstep::cli::RunOptions run;
  lockstep::cli::BenchOptions bench;
  lockstep::cli::add_run_command(app, run);
  lockstep::cli::add_bench_command(app, bench);
  lockstep::cli::DoctorOptions doctor;
  lockstep::cli::add_doctor_command(app, doctor);
  // mpirun and nccl-tests users type "-np N"; CLI11 takes only one-letter
  // short options, so it is spelled --np inside.
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args)
    if (a == "-np") a = "--np";
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
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}

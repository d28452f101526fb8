// A main for fuzz targets where libFuzzer is not available (g++ builds):
// runs LLVMFuzzerTestOneInput once on every file of the corpus named on the
// command line (files, or directories of files), so the corpus is a
// regression test in every build. With `--mutations N` it also runs N
// mutants of each input (bits flipped, bytes overwritten, inserted or
// removed, the tail cut off, a stretch repeated), drawn from a fixed seed
// (`--seed S`, default 1) so that a failure is reproducible: a fuzzer
// without coverage guidance, for targets libFuzzer cannot build. The input
// being run is printed first when LOCKSTEP_FUZZ_VERBOSE is set.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void run(const Bytes& input) { LLVMFuzzerTestOneInput(input.data(), input.size()); }

Bytes mutate(Bytes input, std::mt19937_64& random) {
  auto pick = [&](std::size_t n) { return n == 0 ? std::size_t{0} : static_cast<std::size_t>(random() % n); };
  const int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(6)) {
      case 0:  // flip a bit
        if (!input.empty()) input[pick(input.size())] ^= static_cast<std::uint8_t>(1u << pick(8));
        break;
      case 1:  // overwrite a byte with an interesting value
        if (!input.empty()) {
          static constexpr std::uint8_t kValues[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
          input[pick(input.size())] = kValues[pick(std::size(kValues))];
        }
        break;
      case 2:  // insert a random byte
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(pick(input.size() + 1)),
                     static_cast<std::uint8_t>(random()));
        break;
      case 3:  // remove a byte
        if (!input.empty()) input.erase(input.begin() + static_cast<std::ptrdiff_t>(pick(input.size())));
        break;
      case 4:  // cut the tail off
        input.resize(pick(input.size() + 1));
        break;
      default: {  // repeat a stretch
        if (input.empty()) break;
        const std::size_t from = pick(input.size());
        const std::size_t len = 1 + pick(std::min<std::size_t>(64, input.size() - from));
        const Bytes stretch(input.begin() + static_cast<std::ptrdiff_t>(from),
                            input.begin() + static_cast<std::ptrdiff_t>(from + len));
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(pick(input.size() + 1)), stretch.begin(),
                     stretch.end());
      }
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 0;
  std::uint64_t seed = 1;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
    } else {
      files.emplace_back(arg);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs in the corpus given\n");
    return 1;
  }
  const bool verbose = std::getenv("LOCKSTEP_FUZZ_VERBOSE") != nullptr;
  std::mt19937_64 random(seed);
  long runs = 0;
  for (const auto& file : files) {
    const Bytes input = read_bytes(file);
    if (verbose) std::fprintf(stderr, "replay: %s\n", file.c_str());
    run(input);
    ++runs;
    for (long m = 0; m < mutations; ++m) {
      if (verbose) std::fprintf(stderr, "replay: %s, mutant %ld (seed %llu)\n", file.c_str(), m,
                                static_cast<unsigned long long>(seed));
      run(mutate(input, random));
      ++runs;
    }
  }
  std::printf("ran %ld input(s) from %zu file(s) without a failure (%ld mutant(s) each, seed %llu)\n", runs,
              files.size(), mutations, static_cast<unsigned long long>(seed));
  return 0;
}

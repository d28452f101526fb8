// Fuzz target: a checkpoint file as the main job reads it back
// (lockstep::torch::load_checkpoint). Whatever bytes are in the file, the
// reader returns (it was a checkpoint) or throws lockstep::Error with one
// sentence naming the file; nothing else escapes, nothing crashes.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "lockstep/error.h"
#include "lockstep/torch/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                           "/lockstep-checkpoint-fuzz-" + std::to_string(::getpid()) + ".ckpt";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    // What the main job reads back (examples/fashion_mnist): a model's
    // state, an optimizer's as a nested archive, and an epoch count.
    lockstep::torch::load_checkpoint(path, [](::torch::serialize::InputArchive& in) {
      ::torch::nn::Linear model(4, 2);
      model->load(in);
      ::torch::serialize::InputArchive optimizer;
      in.read("optimizer", optimizer);
      ::torch::Tensor epoch;
      in.read("epochs_done", epoch, /*is_buffer=*/true);
      if (epoch.numel() == 1) (void)epoch.item<std::int64_t>();
    });
  } catch (const lockstep::Error& e) {
    if (std::strstr(e.what(), path.c_str()) == nullptr) std::abort();  // the message must name the file
  }
  ::unlink(path.c_str());
  return 0;
}

// Uses only the installed public headers: a world of one all-reduce.
#include <lockstep/process_group.h>

#include <cstdio>
#include <vector>

int main() {
  lockstep::GroupOptions options;
  options.rank = 0;
  options.world_size = 1;
  options.store = std::make_shared<lockstep::HashStore>();
  auto pg = lockstep::init_process_group(options);
  std::vector<float> v{1, 2, 3};
  pg->allreduce(lockstep::view(std::span(v)), lockstep::ReduceOp::avg)->wait();
  std::printf("consumer ok: %g %g %g\n", v[0], v[1], v[2]);
  return v[2] == 3.0f ? 0 : 1;
}

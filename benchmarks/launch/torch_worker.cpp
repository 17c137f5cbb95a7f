// A minimal libtorch worker for launch_bench: what every libtorch training program pays before
// its first step -- loading libtorch, one tensor operation -- plus joining the job's store and one
// barrier. With --bare it skips the store: the same binary run alone is the floor launch is
// measured against.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ATen/ATen.h>

#include "dtrain/base/job_store.h"

int main(int argc, char** argv) {
  const bool bare = argc > 1 && std::strcmp(argv[1], "--bare") == 0;
  at::Tensor t = at::ones({4, 4}).sum();
  if (t.item<float>() != 16.0f) return 3;
  if (bare) return 0;
  const char* worldEnv = std::getenv("WORLD_SIZE");
  const int world = worldEnv ? std::atoi(worldEnv) : 1;
  auto store = dtrain::store::connectToJobStore();
  if (store->add("barrier/start/count", 1) >= world) store->setString("barrier/start/done", "1");
  store->wait({"barrier/start/done"});
  return 0;
}

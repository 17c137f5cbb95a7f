// launch: start, supervise and restart a distributed training job.
#include <cstdio>
#include <cstring>

namespace dtrain::launcher {
const char* launcherVersion();
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("launch (dtrain) %s\n", dtrain::launcher::launcherVersion());
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: launch [options] [--] program [args...]\n");
      return 0;
    }
  }
  std::fprintf(stderr, "launch: nothing was started: HINT: see launch --help\n");
  return 2;
}

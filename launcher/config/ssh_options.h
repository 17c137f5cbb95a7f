#pragma once
// The ssh options of a launch (--ssh-port, --ssh-identity, --ssh-option, ...), as LaunchConfig
// holds them. The ssh argv they make is launcher/cluster/remote/remote_command.h.

#include <string>
#include <vector>

namespace dtrain::launcher::remote {

// How to reach the other nodes.
struct SshOptions {
  std::string program = "ssh";
  int port = 0;                      // 0: ssh's default (or the config's)
  std::string identity;              // -i
  std::string configFile;            // -F
  std::vector<std::string> options;  // -o passthrough, in order, before launch's own
  double connectTimeout = 10;        // seconds: -o ConnectTimeout
  bool acceptNewHostKeys = false;    // -o StrictHostKeyChecking=accept-new
};

}  // namespace dtrain::launcher::remote

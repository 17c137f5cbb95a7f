#include "dtrain/base/job_store.h"

#include <cstdlib>

#include "dtrain/base/error.h"
#include "dtrain/base/tcp_store.h"
#include "env_contract.h"
#include "parse_int.h"

namespace dtrain::store {

namespace {

std::string requireEnv(const char* name) {
  const char* value = std::getenv(name);
  DTRAIN_CHECK_ARG(value != nullptr && *value != '\0',
                   "{} is not set. HINT: start the program with `launch`, which sets it (with "
                   "{}, {} and {})",
                   name, env::kStoreAddr, env::kStorePort, env::kDtrainRestartCount);
  return value;
}

long long parseInt(const char* name, const std::string& text, long long min, long long max) {
  int64_t v = 0;
  DTRAIN_CHECK_ARG(parseInt64(text, &v) && v >= min && v <= max,
                   "{}=\"{}\" is not an integer in [{}, {}]. HINT: start the program with "
                   "`launch`, which sets it",
                   name, text, min, max);
  return v;
}

}  // namespace

std::shared_ptr<PrefixStore> connectToJobStore(const JobStoreOptions& options) {
  TcpStoreOptions o;
  o.host = requireEnv(env::kStoreAddr);
  o.port = static_cast<uint16_t>(parseInt(env::kStorePort, requireEnv(env::kStorePort), 1, 65535));
  int round = static_cast<int>(
      parseInt(env::kDtrainRestartCount, requireEnv(env::kDtrainRestartCount), 0, 1000000000));
  // The token is optional here: a store without one accepts only clients without one, and a
  // store that requires one says so (see Note [Store authentication]).
  const char* token = std::getenv(env::kStoreToken);
  o.token = token != nullptr ? token : "";
  o.connectTimeout = options.connectTimeout;
  o.timeout = options.timeout;
  auto store = std::make_shared<TcpStore>(o);
  return std::make_shared<PrefixStore>(roundPrefix(round), store);
}

}  // namespace dtrain::store

#pragma once
// Opening a TcpStore client connection: connect to every address the host resolves to, with
// retry and exponential backoff until the connect timeout, then the handshake of Note [Store wire
// format] (and of Note [Store authentication] when there is a token).

#include <string>

#include "dtrain/base/tcp_store.h"
#include "net/socket.h"

namespace dtrain::store {

// A connected, authenticated, non-blocking socket to options.host:options.port (`where`, for
// messages). Throws NetworkError or TimeoutError once options.connectTimeout has passed, and Error
// at once when retrying cannot help: the peer is not a dtrain store, speaks another wire version,
// or does not share this client's `token` (empty: none).
net::Socket connectToStore(const TcpStoreOptions& options, const std::string& token,
                           const std::string& where);

}  // namespace dtrain::store

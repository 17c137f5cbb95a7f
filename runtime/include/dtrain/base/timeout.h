#pragma once
// What a timeout of zero means in dtrain: the default deadline, everywhere.
//
// Note [Zero timeouts]
// A zero timeout has one meaning in every dtrain API: "the default deadline".
//   - Store::wait(keys, 0) waits the store's timeout() (TcpStoreOptions::timeout, 300 s);
//   - Work::wait(0) waits as long as the collective itself may take: its timeout
//     (CallOptions::timeout, else the communicator's) plus the moments the ranks need to compare
//     notes when it fails;
//   - a zero timeout in an options struct (TcpStoreOptions, TcpStoreServerOptions, JobStoreOptions,
//     GlooOptions, NcclOptions, WorldOptions, InitOptions, DdpOptions, CallOptions) is that
//     option's documented default.
// Nothing waits without a deadline. Zero is never "no timeout" (c10d's kNoTimeout, whose value is
// zero too) nor "look and return at once": a caller that wants to look without waiting calls
// Store::check() or Work::isCompleted(). A negative timeout is an InvalidArgument.

#include <chrono>

namespace dtrain {

// `requested`, or `byDefault` when `requested` is zero (Note [Zero timeouts]). Throws
// InvalidArgument naming `what` ("TcpStoreOptions::timeout") when `requested` is negative.
std::chrono::milliseconds timeoutOrDefault(std::chrono::milliseconds requested,
                                           std::chrono::milliseconds byDefault, const char* what);

}  // namespace dtrain

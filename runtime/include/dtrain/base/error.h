#pragma once
// One exception family for all of dtrain (docs/design.md#errors-and-logging).
//
// Library code throws through the DTRAIN_CHECK / DTRAIN_THROW macros, which add file:line; only a
// program's main() maps exceptions to exit codes. Messages say who, where and how far it got, and
// end in a "HINT: ..." when there is something the user can do.

#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A deadline passed: a store operation, a rendezvous, a collective.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A connection failed, was reset, or closed by the peer.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// The caller passed something invalid: a bad option, spec, key or size.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A checkpoint is torn, truncated, foreign, or could not be written.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The job's membership changed: a collective was aborted because a node was lost
// (Communicator::abort); the runtime re-forms its communicators among the survivors.
class MembershipChanged : public Error {
 public:
  using Error::Error;
};

namespace detail {
// "message [file.cpp:123]": the basename only, so messages do not leak build paths.
std::string withLocation(const std::string& message, const char* file, int line);
}  // namespace detail

}  // namespace dtrain

// Throws `Type` with a fmt-formatted message and the throwing location.
#define DTRAIN_THROW(Type, ...) \
  throw Type(::dtrain::detail::withLocation(::fmt::format(__VA_ARGS__), __FILE__, __LINE__))

// What DTRAIN_THROW would throw, as an exception_ptr: for an error found now and thrown later, by
// another call or another thread.
#define DTRAIN_ERROR_PTR(Type, ...) \
  ::std::make_exception_ptr(        \
      Type(::dtrain::detail::withLocation(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)))

// Throws dtrain::Error unless `cond` holds.
#define DTRAIN_CHECK(cond, ...)                   \
  do {                                            \
    if (!(cond)) {                                \
      DTRAIN_THROW(::dtrain::Error, __VA_ARGS__); \
    }                                             \
  } while (0)

// Throws `Type` unless `cond` holds.
#define DTRAIN_CHECK_T(Type, cond, ...) \
  do {                                  \
    if (!(cond)) {                      \
      DTRAIN_THROW(Type, __VA_ARGS__);  \
    }                                   \
  } while (0)

#define DTRAIN_CHECK_ARG(cond, ...) DTRAIN_CHECK_T(::dtrain::InvalidArgument, cond, __VA_ARGS__)

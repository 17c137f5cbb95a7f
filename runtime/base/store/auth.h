#pragma once
// Job-token authentication of store connections: nonces from the kernel's generator (getrandom),
// HMAC-SHA256 proofs and their constant-time comparison from OpenSSL's libcrypto (never a
// home-made hash).
//
// Note [Store authentication]
// The launcher makes a random token per job and hands it to workers through the environment
// only (DTRAIN_STORE_TOKEN; never argv, never logs). Each connection runs a challenge-response
// over fresh 32-byte nonces from both sides (Note [Store wire format]): the server proves it
// holds the token first, then the client does. So
//   - the token never crosses the wire, and a recorded handshake cannot be replayed (the other
//     side's nonce differs next time);
//   - a worker that reaches another job's store on the same port (docs/reliability.md S8) refuses
//     it before sending a single key, instead of joining a foreign job;
//   - a client without the token is turned away before the server reads anything of variable
//     length from it.
// The proofs use different labels, so neither side can reflect the other's proof back. This is
// authentication, not encryption: keys and values travel in clear, as in c10d's TCPStore; run
// jobs on a network you trust with the values.

#include <string>

#include "store/wire.h"

namespace dtrain::store::auth {

// 32 bytes from the kernel's generator (getrandom); throws dtrain::Error when the generator fails.
wire::Nonce randomNonce();

// HMAC-SHA256(token, label || first || second).
wire::Mac serverProof(const std::string& token, const wire::Nonce& clientNonce,
                      const wire::Nonce& serverNonce);
wire::Mac clientProof(const std::string& token, const wire::Nonce& serverNonce,
                      const wire::Nonce& clientNonce);

// Plain HMAC-SHA256, for the known-answer test.
wire::Mac hmacSha256(const std::string& key, const uint8_t* data, size_t size);

// Constant time (CRYPTO_memcmp): how much of a forged proof matched never shows in timing.
bool sameMac(const wire::Mac& a, const wire::Mac& b);

// Frees OpenSSL's state of the calling thread (OPENSSL_thread_stop) while the library is whole:
// a thread that ends during the process's exit would otherwise free it in its thread-exit
// handler concurrently with OpenSSL's own cleanup (Note [Progress publisher]).
void releaseThreadState();

}  // namespace dtrain::store::auth

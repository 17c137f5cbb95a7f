#include "store/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "dtrain/base/error.h"

namespace dtrain::store::auth {

namespace {

constexpr char kServerLabel[] = "dtrain-store-server-v1";
constexpr char kClientLabel[] = "dtrain-store-client-v1";

wire::Mac proof(const std::string& token, const char* label, const wire::Nonce& first,
                const wire::Nonce& second) {
  std::string text(label);
  std::vector<uint8_t> message(text.begin(), text.end());
  message.insert(message.end(), first.begin(), first.end());
  message.insert(message.end(), second.begin(), second.end());
  return hmacSha256(token, message.data(), message.size());
}

}  // namespace

wire::Nonce randomNonce() {
  // The kernel's generator, which OpenSSL's own is seeded from: RAND_bytes would first build its
  // DRBG, about 1 ms of CPU in every process that connects (a worker's first store connection),
  // which 256 workers starting at once on one machine feel.
  wire::Nonce nonce;
  size_t got = 0;
  while (got < nonce.size()) {
    ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      DTRAIN_THROW(Error, "store: getrandom failed ({}) making a handshake nonce",
                   std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  return nonce;
}

wire::Mac hmacSha256(const std::string& key, const uint8_t* data, size_t size) {
  wire::Mac mac{};
  unsigned int len = 0;
  // An empty key is legal for HMAC but OpenSSL wants a non-null pointer.
  static const uint8_t kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), data, size, mac.data(), &len) ==
          nullptr ||
      len != mac.size()) {
    DTRAIN_THROW(Error, "store: OpenSSL HMAC-SHA256 failed (error {:#x})", ERR_get_error());
  }
  return mac;
}

wire::Mac serverProof(const std::string& token, const wire::Nonce& clientNonce,
                      const wire::Nonce& serverNonce) {
  return proof(token, kServerLabel, clientNonce, serverNonce);
}

wire::Mac clientProof(const std::string& token, const wire::Nonce& serverNonce,
                      const wire::Nonce& clientNonce) {
  return proof(token, kClientLabel, serverNonce, clientNonce);
}

bool sameMac(const wire::Mac& a, const wire::Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void releaseThreadState() { OPENSSL_thread_stop(); }

}  // namespace dtrain::store::auth

/* The XTS key and the loop over data units: AES-NI (xts_aesni.c) or OpenSSL's EVP. */
#include <openssl/evp.h>
#include <string.h>

#include "xts.h"

static int cpu_has_aesni(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1")
           && __builtin_cpu_supports("pclmul");
#else
    return 0;
#endif
}

int cpu_has_vaes(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return cpu_has_aesni() && __builtin_cpu_supports("vaes") && __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

const char *xts_default_impl(void)
{
    return cpu_has_vaes() ? "vaes" : cpu_has_aesni() ? "aesni" : "openssl";
}

const char *xts_key_impl(const xts_key_t *k)
{
    return k->impl == XTS_VAES ? "vaes" : k->impl == XTS_AESNI ? "aesni"
         : k->impl == XTS_OPENSSL ? "openssl" : "none";
}

void xts_key_free(xts_key_t *k)
{
    if (k->evp_enc)
        EVP_CIPHER_CTX_free(k->evp_enc);
    if (k->evp_dec)
        EVP_CIPHER_CTX_free(k->evp_dec);
    if (k->lock_ready)
        pthread_mutex_destroy(&k->lock);
    k->evp_enc = k->evp_dec = NULL;
    k->lock_ready = 0;
    k->impl = 0;
}

static EVP_CIPHER_CTX *evp_keyed(const uint8_t *key, size_t len, int encrypt)
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    const EVP_CIPHER *c = len == 32 ? EVP_aes_128_xts() : EVP_aes_256_xts();
    if (ctx && EVP_CipherInit_ex(ctx, c, NULL, key, NULL, encrypt) == 1)
        return ctx;
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
}

int xts_key_set(xts_key_t *k, const uint8_t *key, size_t len, int impl)
{
    if (impl == XTS_AUTO)
        impl = cpu_has_vaes() ? XTS_VAES : cpu_has_aesni() ? XTS_AESNI : XTS_OPENSSL;
    if (impl == XTS_AESNI || impl == XTS_VAES) {
        if (!(impl == XTS_VAES ? cpu_has_vaes() : cpu_has_aesni()))
            return -1;
        aesni_expand(k, key, len);
    } else {
        /* OpenSSL 3 refuses key1 == key2 for encryption, which IEEE 1619-2007 allows:
         * the caller keeps such a key on its other path. */
        k->evp_enc = evp_keyed(key, len, 1);
        k->evp_dec = evp_keyed(key, len, 0);
        if (!k->evp_enc || !k->evp_dec || pthread_mutex_init(&k->lock, NULL)) {
            xts_key_free(k);
            return -1;
        }
        k->lock_ready = 1;
    }
    k->impl = impl;
    return 0;
}

static int evp_units(xts_key_t *k, const uint8_t *src, uint8_t *dst, size_t len, size_t unit,
                     uint64_t lo, uint64_t hi, int encrypt)
{
    EVP_CIPHER_CTX *ctx = encrypt ? k->evp_enc : k->evp_dec;
    int rc = 0;
    pthread_mutex_lock(&k->lock);
    for (size_t off = 0; off < len && !rc; off += unit) {
        size_t n = len - off < unit ? len - off : unit;
        uint8_t iv[16];
        memcpy(iv, &lo, 8);        /* little-endian hosts: the sequence number as IEEE 1619 */
        memcpy(iv + 8, &hi, 8);
        int out = 0;
        if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, iv, encrypt) != 1
            || EVP_CipherUpdate(ctx, dst + off, &out, src + off, (int)n) != 1 || (size_t)out != n)
            rc = -1;
        if (++lo == 0)
            hi++;
    }
    pthread_mutex_unlock(&k->lock);
    return rc;
}

int xts_units(xts_key_t *k, const uint8_t *src, uint8_t *dst, size_t len, size_t unit,
              uint64_t lo, uint64_t hi, int encrypt)
{
    if (k->impl == XTS_OPENSSL)
        return evp_units(k, src, dst, len, unit, lo, hi, encrypt);
    if (k->impl != XTS_AESNI && k->impl != XTS_VAES)
        return -1;
    aesni_units(k, src, dst, len, unit, lo, hi, encrypt);
    return 0;
}

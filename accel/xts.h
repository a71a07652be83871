/* AES-XTS over consecutive data units (IEEE 1619): AES-NI when the CPU has it, OpenSSL's
 * EVP otherwise; accel/native.c calls it with the GIL released. */
#ifndef SOFTHCA_ACCEL_XTS_H
#define SOFTHCA_ACCEL_XTS_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum { XTS_AUTO, XTS_AESNI, XTS_OPENSSL, XTS_VAES };

typedef struct {
    int impl;                  /* XTS_VAES, XTS_AESNI or XTS_OPENSSL once set */
    int rounds;                /* 10 (AES-128) or 14 (AES-256) */
    /* AES-NI: key1's encryption and decryption schedules, key2's encryption schedule,
     * 16-byte aligned, as __m128i arrays (xts_aesni.c). */
    uint8_t enc[15 * 16] __attribute__((aligned(16)));
    uint8_t dec[15 * 16] __attribute__((aligned(16)));
    uint8_t tweak[15 * 16] __attribute__((aligned(16)));
    /* OpenSSL: one EVP context per direction, keyed once; each unit sets only the IV.
     * A context carries state between init and update, hence the lock. */
    void *evp_enc, *evp_dec;
    pthread_mutex_t lock;
    int lock_ready;
} xts_key_t;

int xts_key_set(xts_key_t *k, const uint8_t *key, size_t len, int impl);
void xts_key_free(xts_key_t *k);
const char *xts_key_impl(const xts_key_t *k);
const char *xts_default_impl(void);
/* len bytes, units of `unit` bytes (a short last unit stealing), unit i with the data unit
 * sequence number (hi:lo) + i mod 2^128. 0, or -1 when the cipher failed. */
int xts_units(xts_key_t *k, const uint8_t *src, uint8_t *dst, size_t len, size_t unit,
              uint64_t lo, uint64_t hi, int encrypt);

/* xts_aesni.c, compiled with -maes: call only when the CPU has AES-NI. */
void aesni_expand(xts_key_t *k, const uint8_t *key, size_t len);
/* Every unit of len bytes (a short last one stealing), sequence numbers from (hi:lo). */
void aesni_units(const xts_key_t *k, const uint8_t *src, uint8_t *dst, size_t len,
                 size_t unit_len, uint64_t lo, uint64_t hi, int encrypt);
/* xts_vaes.c, compiled with -mvaes -mavx2: sixteen blocks, their sixteen tweaks. */
void vaes_16(const void *round_keys, int nr, const uint8_t *src, uint8_t *dst,
             const void *tweaks, int encrypt);
int cpu_has_vaes(void);
#endif

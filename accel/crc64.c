/* CRC-64/NVME (the CRC64_XP10 guard): reflected polynomial 0xAD93D23594C93659, register
 * start from the seed, final xor all ones. ISA-L 2.30 has no function for this polynomial.
 *
 * Bulk: carry-less multiplication folds the buffer into one 128-bit remainder, four
 * accumulators 64 bytes apart so the multiplier is never waited on. Folding a 16-byte
 * value forward by d bits multiplies its two 64-bit halves by x^(d+63) and x^(d-1) mod P
 * (the extra x of a reflected carry-less product makes up the rest); those constants are
 * computed here from P at start-up. The CRC of a buffer with register start 0 depends only
 * on its value mod P, so the last 16-byte remainder and the bytes after it go through the
 * table at the end, which needs no Barrett reduction. Compiled with -mpclmul; used only
 * after the CPU says it has PCLMULQDQ, the table alone otherwise. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "crc64.h"

static const uint64_t POLY = 0xAD93D23594C93659ULL;        /* x^64 implied */
static uint64_t table[8][256];
static __m128i fold16, fold64;                                /* d = 128 and d = 512 bits */
static int have_clmul;

static uint64_t reflect64(uint64_t v)
{
    uint64_t r = 0;
    for (int i = 0; i < 64; i++)
        r |= (v >> i & 1) << (63 - i);
    return r;
}

/* x^n mod P, unreflected. */
static uint64_t xpow_mod(unsigned n)
{
    uint64_t r = 1;
    while (n--)
        r = (r << 1) ^ (r >> 63 ? POLY : 0);
    return r;
}

static __m128i fold_constants(unsigned d)
{
    return _mm_set_epi64x((long long)reflect64(xpow_mod(d - 1)),
                          (long long)reflect64(xpow_mod(d + 63)));
}

void crc64_setup(void)
{
    const uint64_t rpoly = reflect64(POLY);
    for (int i = 0; i < 256; i++) {
        uint64_t c = (uint64_t)i;
        for (int b = 0; b < 8; b++)
            c = (c & 1) ? (c >> 1) ^ rpoly : c >> 1;
        table[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
    fold16 = fold_constants(128);
    fold64 = fold_constants(512);
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

int crc64_clmul_available(void)
{
    return have_clmul;
}

static uint64_t by_table(uint64_t reg, const uint8_t *p, size_t len)
{
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        reg ^= w;
        reg = table[7][reg & 0xFF] ^ table[6][(reg >> 8) & 0xFF] ^ table[5][(reg >> 16) & 0xFF]
            ^ table[4][(reg >> 24) & 0xFF] ^ table[3][(reg >> 32) & 0xFF]
            ^ table[2][(reg >> 40) & 0xFF] ^ table[1][(reg >> 48) & 0xFF] ^ table[0][reg >> 56];
    }
    while (len--)
        reg = (reg >> 8) ^ table[0][(reg ^ *p++) & 0xFF];
    return reg;
}

uint64_t crc64_nvme_table(uint64_t reg, const uint8_t *p, size_t len)
{
    return ~by_table(reg, p, len);
}

static inline __m128i fold(__m128i x, __m128i k, __m128i next)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00),
                                       _mm_clmulepi64_si128(x, k, 0x11)), next);
}

static inline __m128i load(const uint8_t *p)
{
    return _mm_loadu_si128((const __m128i *)p);
}

uint64_t crc64_nvme(uint64_t reg, const uint8_t *p, size_t len)
{
    if (!have_clmul || len < 64)
        return ~by_table(reg, p, len);
    /* The register start is the first 8 bytes xored with it, then a start of 0. */
    __m128i a0 = _mm_xor_si128(load(p), _mm_cvtsi64_si128((long long)reg));
    __m128i a1 = load(p + 16), a2 = load(p + 32), a3 = load(p + 48);
    p += 64;
    len -= 64;
    for (; len >= 64; p += 64, len -= 64) {
        a0 = fold(a0, fold64, load(p));
        a1 = fold(a1, fold64, load(p + 16));
        a2 = fold(a2, fold64, load(p + 32));
        a3 = fold(a3, fold64, load(p + 48));
    }
    __m128i x = fold(fold(fold(a0, fold16, a1), fold16, a2), fold16, a3);
    for (; len >= 16; p += 16, len -= 16)
        x = fold(x, fold16, load(p));
    uint8_t rest[16];
    _mm_storeu_si128((__m128i *)rest, x);
    return ~by_table(by_table(0, rest, 16), p, len);
}
